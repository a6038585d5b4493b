"""SIGTERM (preemption) makes the trainer checkpoint the current step and exit cleanly."""

import json
import os
import signal
import subprocess
import sys
import time

from composer_jax.train import checkpointing
from tests.train.conftest import DATA_DIR

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _logged_steps(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line)["step"] for line in f if line.endswith("\n")]


def test_sigterm_checkpoints_and_exits_cleanly(tmp_path):
  workdir = str(tmp_path)
  proc = subprocess.Popen(
      [sys.executable, "-m", "experiments.run", f"--workdir={workdir}",
       "--config.train.steps=100000", "--config.train.seq_len=32",
       "--config.train.batch_size=4", "--config.train.log_every=1",
       "--config.train.eval_every=0", "--config.train.ckpt_every=100000",
       f"--config.data.paths={DATA_DIR}", "--config.data.validation_fraction=0.2"],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 600
    while len(_logged_steps(workdir)) < 3:
      assert proc.poll() is None, proc.communicate()[1]
      assert time.time() < deadline, "trainer logged no steps in 600 s"
      time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 0, stderr
  assert "Preemption signal: saved checkpoint" in stderr
  last = _logged_steps(workdir)[-1]
  ckpt = checkpointing.Checkpointer(workdir, keep=1)
  assert ckpt.all_steps() == [last]  # no periodic save was due: this one is the SIGTERM save
  ckpt.close()
  assert 3 <= last < 100000
