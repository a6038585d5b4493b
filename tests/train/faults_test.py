"""Faults the trainer survives without losing data: corrupt checkpoints, torn metrics,
kill -9 during a save, SIGTERM mid-step, a full disk. Every fault is injected here."""

import errno
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import grain
import jax.numpy as jnp
import pytest

from composer_jax.model.config import get_preset
from composer_jax.train import checkpointing, loop
from composer_jax.train.metrics import MetricsWriter, read_metrics
from tests.train.conftest import DATA_DIR, TOTAL_STEPS, tiny_config

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _losses(records):
  return {r["step"]: r["loss"] for r in records if "loss" in r}


def _truncate(path):
  os.truncate(path, os.path.getsize(path) // 2)
  return path


# Which file of checkpoint `d` a fault truncates, and the file the error must name.
_CORRUPTIONS = {
  "array_data": (
    lambda d: max(glob.glob(f"{d}/state/ocdbt.process_0/d/*"), key=os.path.getsize),
    lambda d: f"{d}: ",
  ),
  "state_metadata": (lambda d: f"{d}/state/_METADATA", lambda d: f"{d}/state/_METADATA: "),
  "config": (lambda d: f"{d}/config/metadata", lambda d: f"{d}/config/metadata: "),
  "data_iterator": (
    lambda d: f"{d}/data/process_0-of-1.json",
    lambda d: f"{d}/data/process_0-of-1.json: ",
  ),
}


def _small_checkpoints(workdir):
  """Checkpoints 1 and 2 of a small state (not a model: the files are what matters)."""
  ckpt = checkpointing.Checkpointer(workdir, keep=3)
  state = {"w": jnp.arange(4096.0), "step": jnp.int32(0)}
  it = iter(grain.MapDataset.range(8).to_iter_dataset())
  for step in (1, 2):
    ckpt.save(step, {**state, "step": jnp.int32(step)}, it, get_preset("tiny"), {})
  ckpt.wait()
  return ckpt, state


@pytest.mark.parametrize("what", sorted(_CORRUPTIONS))
def test_corrupt_checkpoint_named_in_one_line(what, tmp_path):
  ckpt, state = _small_checkpoints(str(tmp_path))
  step_dir = f"{ckpt.directory}/2"
  corrupt, named = _CORRUPTIONS[what]
  _truncate(corrupt(step_dir))
  it = iter(grain.MapDataset.range(8).to_iter_dataset())
  with pytest.raises(checkpointing.CorruptCheckpointError) as e:
    ckpt.saved_model_config(2)
    ckpt.restore(2, state, it)
  msg = str(e.value)
  assert msg.startswith(f"checkpoint step 2 does not restore: {named(step_dir)}"), msg
  assert "\n" not in msg
  assert int(ckpt.restore(1, state, it)["step"]) == 1  # the previous one is intact
  assert ckpt.set_aside(2) == f"{step_dir}.corrupt"
  assert ckpt.all_steps() == [1] and os.path.isdir(f"{step_dir}.corrupt")
  ckpt.close()


def test_resume_falls_back_past_corrupt_checkpoint(full_run, tmp_path, caplog):
  """Newest checkpoint (6) truncated: the run resumes from 3, keeps 6 aside, and its
  losses equal the uninterrupted run's bit for bit."""
  src, full = full_run
  workdir = str(tmp_path / "w")
  shutil.copytree(src, workdir)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  _truncate(_CORRUPTIONS["array_data"][0](f"{ckpt_dir}/6"))
  with caplog.at_level("WARNING"):
    records = loop.train(tiny_config(), workdir)
  assert _losses(records) == {s: v for s, v in _losses(full).items() if s > 3}
  assert f"checkpoint step 6 does not restore: {ckpt_dir}/6: " in caplog.text
  assert f"renamed it to {ckpt_dir}/6.corrupt and resuming from step 3" in caplog.text
  assert sorted(os.listdir(ckpt_dir)) == ["3", "6", "6.corrupt"]
  assert [r["step"] for r in read_metrics(workdir)] == list(range(1, TOTAL_STEPS + 1))
  assert _losses(read_metrics(workdir)) == _losses(full)

  _truncate(f"{ckpt_dir}/3/config/metadata")  # now none restores: stop, rename nothing
  _truncate(_CORRUPTIONS["array_data"][0](f"{ckpt_dir}/6"))
  with pytest.raises(
    checkpointing.CorruptCheckpointError,
    match=rf"no checkpoint in {ckpt_dir} restores \(steps \[6, 3\]\)",
  ):
    loop.train(tiny_config(), workdir)
  assert sorted(os.listdir(ckpt_dir)) == ["3", "6", "6.corrupt"]


def test_torn_metrics_line_moved_aside(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text(
    "".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo'
  )
  MetricsWriter(str(tmp_path), 10, start_step=2).close()  # resumed from checkpoint 2
  assert path.read_text() == '{"step": 1, "loss": 0.1}\n{"step": 2, "loss": 0.2}\n'
  assert (tmp_path / "metrics.jsonl.torn").read_text() == '{"step": 4, "lo\n'
  assert (tmp_path / "metrics.jsonl.rerun").read_text() == '{"step": 3, "loss": 0.3}\n'


def test_full_disk_is_one_line(tmp_path, monkeypatch):
  """Too little space for the next checkpoint: one line, before anything is written."""
  ckpt, state = _small_checkpoints(str(tmp_path))
  monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(1 << 30, 0, 100))
  it = iter(grain.MapDataset.range(8).to_iter_dataset())
  with pytest.raises(checkpointing.CheckpointSaveError) as e:
    ckpt.save(3, state, it, get_preset("tiny"), {})
  assert e.value.errno == errno.ENOSPC
  assert str(e.value).startswith(
    f"[Errno 28] cannot write checkpoint step 3: it needs ~1.0 "
    f"MiB, 0.0 MiB free in {ckpt.directory}"
  ), str(e.value)
  ckpt.close()
  assert ckpt.all_steps() == [1, 2]


def test_async_save_failure_is_one_line(tmp_path, monkeypatch):
  """A write that fails in orbax's background thread (an injected ENOSPC) comes back
  as one CheckpointSaveError naming the step, not as thread tracebacks."""
  ckpt, state = _small_checkpoints(str(tmp_path))
  from grain._src.python.checkpoint import handler as grain_handler

  def full(*_, **__):
    raise OSError(errno.ENOSPC, "No space left on device", "process_0-of-1.json")

  monkeypatch.setattr(grain_handler.CheckpointHandler, "save", full)
  it = iter(grain.MapDataset.range(8).to_iter_dataset())
  with pytest.raises(
    checkpointing.CheckpointSaveError,
    match=r"checkpoint save in .* failed \(while saving step 3\): \[Errno 28\] "
    r"No space left.*; checkpoints \[1, 2\] are intact",
  ):
    ckpt.save(3, state, it, get_preset("tiny"), {})
    ckpt.wait()
  ckpt.close()  # the error is not raised a second time
  assert ckpt.all_steps() == [1, 2]


def _block_commit(monkeypatch, step: str, seconds: float, fail: bool):
  """The commit (rename) of checkpoint `step` waits `seconds` in orbax's writer thread,
  then fails with ENOSPC if `fail`: a save still in flight when the next one starts."""
  from orbax.checkpoint._src.path import atomicity

  commit = atomicity.AtomicRenameTemporaryPath.finalize

  async def finalize(self, *a, **k):
    if self.get_final().name == step:
      time.sleep(seconds)
      if fail:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.get()))
    return await commit(self, *a, **k)

  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", finalize)


@pytest.mark.parametrize("in_flight", ["fails", "commits"])
def test_full_disk_message_names_only_committed_steps(in_flight, tmp_path, monkeypatch):
  """Step 3 is still being written when step 4 finds the disk full: the message waits for
  it and lists what is committed on disk (3 only if its commit went through)."""
  ckpt, state = _small_checkpoints(str(tmp_path))
  _block_commit(monkeypatch, "3", 1.0, fail=in_flight == "fails")
  it = iter(grain.MapDataset.range(8).to_iter_dataset())
  ckpt.save(3, state, it, get_preset("tiny"), {})
  monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(1 << 30, 0, 100))
  with pytest.raises(checkpointing.CheckpointSaveError) as e:
    ckpt.save(4, state, it, get_preset("tiny"), {})
  ckpt.close()
  msg = str(e.value)
  assert "\n" not in msg
  if in_flight == "fails":  # the earlier failure is the one reported
    assert "No space left on device" in msg and msg.endswith("checkpoints [1, 2] are intact")
    assert glob.glob(f"{ckpt.directory}/3.orbax-checkpoint-tmp*")  # half-written, not a step
  else:
    assert msg.endswith("(checkpoints [1, 2, 3] are intact)"), msg
  assert ckpt.committed_steps() == ([1, 2] if in_flight == "fails" else [1, 2, 3])


def test_half_written_save_is_no_step_and_is_removed(tmp_path):
  """A temporary directory left by a save cut short (kill -9, full disk) is not listed as
  a checkpoint, and the next run in the workdir removes it (before its first save)."""
  ckpt, state = _small_checkpoints(str(tmp_path))
  ckpt.close()
  tmp = os.path.join(ckpt.directory, "3.orbax-checkpoint-tmp-1700000000000000")
  os.makedirs(os.path.join(tmp, "state"))
  reopened = checkpointing.Checkpointer(str(tmp_path), keep=3)
  assert reopened.committed_steps() == [1, 2] and reopened.all_steps() == [1, 2]
  reopened.save(3, state, iter(grain.MapDataset.range(8).to_iter_dataset()), get_preset("tiny"), {})
  reopened.close()
  assert not os.path.exists(tmp) and reopened.committed_steps() == [1, 2, 3]


class _Diverging:
  """A `loop.Steps` whose state turns NaN in step 3 while every logged value stays finite
  (as an RL run with a NaN loss coefficient: nothing in the record shows it)."""

  def step(self, state, step):
    w = state["params"]["w"] * (jnp.nan if step + 1 == 3 else 1.0) + 1.0
    return {"params": {"w": w}, "step": jnp.int32(step + 1)}, {"loss": 1.0, "grad_norm": 0.5}

  def record(self, step, metrics, state):
    return {**metrics, "step": step}

  def checkpoint(self, state):
    return state, {}


def test_non_finite_state_is_never_saved_nor_resumed(tmp_path, monkeypatch, caplog):
  workdir = str(tmp_path)
  state = {"params": {"w": jnp.zeros(8)}, "step": jnp.int32(0)}
  with pytest.raises(checkpointing.NonFiniteStateError) as e:
    loop.drive(
      _Diverging(),
      state,
      0,
      checkpointing.Checkpointer(workdir, keep=3),
      workdir=workdir,
      total_steps=6,
      ckpt_every=2,
      console_every=1,
      model_cfg=get_preset("tiny"),
      run_config={},
    )
  ckpt = checkpointing.Checkpointer(workdir, keep=3)
  assert str(e.value) == (
    "checkpoint step 4 not written: the state is not finite (1 of 1 arrays hold NaN/inf, "
    f"the first is params/w); the last good checkpoint, {ckpt.directory}/2, is kept"
  )
  assert ckpt.all_steps() == [2]
  assert [r["step"] for r in read_metrics(workdir)] == [1, 2, 3, 4]

  # A NaN checkpoint written anyway (by a version without this check) is set aside on
  # resume like a corrupt one: the run goes on from the last finite one.
  monkeypatch.setattr(checkpointing, "nonfinite_arrays", lambda _: (0, 1, None))
  ckpt.save(
    4, {"params": {"w": jnp.full(8, jnp.inf)}, "step": jnp.int32(4)}, {}, get_preset("tiny"), {}
  )
  ckpt.wait()
  monkeypatch.undo()
  restored = loop.restore_newest(
    get_preset("tiny"), ckpt, lambda step: ckpt.restore(step, state), workdir
  )
  assert int(restored["step"]) == 2 and jnp.isfinite(restored["params"]["w"]).all()
  assert (
    "checkpoint step 4 does not restore: 1 of 1 arrays hold NaN/inf, the first is "
    f"params/w; renamed it to {ckpt.directory}/4.corrupt"
  ) in caplog.text
  assert ckpt.all_steps() == [2]
  ckpt.close()


# Runs experiments.run with one fault injected (argv[1]):
#   block_save:STEP:MARKER  the commit of checkpoint STEP never finishes (MARKER is touched
#                           when it starts): the test kills the process there with -9;
#   sigterm_at:STEP         SIGTERM arrives while step STEP runs (preemption).
_INJECT = """
import os, runpy, signal, sys, time
mode, *args = sys.argv.pop(1).split(":")
if mode == "block_save":
  from orbax.checkpoint._src.path import atomicity
  commit = atomicity.AtomicRenameTemporaryPath.finalize
  async def finalize(self, *a, **k):
    if self.get_final().name == args[0]:
      open(args[1], "w").close()
      time.sleep(3600)
    return await commit(self, *a, **k)
  atomicity.AtomicRenameTemporaryPath.finalize = finalize
elif mode == "sigterm_at":
  from composer_jax.train import programs
  make = programs.programs
  def with_sigterm(*a, **k):
    progs = make(*a, **k)
    def train_step(state, batch):
      if int(state.step) + 1 == int(args[0]):
        os.kill(os.getpid(), signal.SIGTERM)
      return progs.train_step(state, batch)
    return progs._replace(train_step=train_step)
  programs.programs = with_sigterm
runpy.run_module("experiments.run", run_name="__main__", alter_sys=True)
"""


def _cli(workdir, fault=None):
  """experiments.run on tiny_config() (flags), checkpoints every 2 steps."""
  flags = [
    f"--workdir={workdir}",
    "--config.optim.total_steps=6",
    "--config.optim.warmup_steps=2",
    f"--config.data.paths={DATA_DIR}",
    "--config.data.validation_fraction=0.2",
    f"--config.train.steps={TOTAL_STEPS}",
    "--config.train.batch_size=4",
    "--config.train.seq_len=32",
    "--config.train.log_every=1",
    "--config.train.eval_every=3",
    "--config.train.eval_batches=1",
    "--config.train.ckpt_every=2",
  ]
  cmd = ["-c", _INJECT, fault] if fault else ["-m", "experiments.run"]
  env = dict(os.environ, JAX_DEFAULT_MATMUL_PRECISION="highest")  # as tests/conftest.py
  return subprocess.Popen(
    [sys.executable, *cmd, *flags],
    cwd=REPO,
    env=env,
    text=True,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )


def _finish(proc):
  _, stderr = proc.communicate(timeout=600)
  assert proc.returncode == 0, stderr
  assert "Traceback" not in stderr, stderr
  return stderr


@pytest.mark.slow
def test_kill_during_save_sigterm_and_torn_metrics_resume_bit_exact(full_run, tmp_path):
  """kill -9 while checkpoint 4 commits, a torn metrics line, SIGTERM during step 5, then
  a resume to the end: every step's loss equals the uninterrupted run's, bit for bit, and
  metrics.jsonl holds every step exactly once."""
  workdir, marker = str(tmp_path / "w"), str(tmp_path / "saving")
  proc = _cli(workdir, f"block_save:4:{marker}")
  try:
    deadline = time.time() + 600
    while not os.path.exists(marker):
      assert proc.poll() is None, proc.communicate()[1]
      assert time.time() < deadline, "checkpoint 4 was never saved"
      time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.kill()
    proc.wait()
  ckpt_dir = os.path.join(workdir, "checkpoints")
  assert "4" not in os.listdir(ckpt_dir) and "2" in os.listdir(ckpt_dir)
  with open(os.path.join(workdir, ".lock")) as f:
    assert json.load(f)["pid"] == proc.pid  # left behind by kill -9
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write('{"step": 7, "loss": 0.12')  # a record cut mid-write

  stderr = _finish(_cli(workdir, "sigterm_at:5"))  # resumes from 2, preempted in step 5
  assert "in use by" not in stderr  # the killed run's lock died with it: nothing to take over
  assert "Moved 1 torn or unreadable lines" in stderr and "records after step 2" in stderr
  assert "Preemption signal: saved checkpoint" in stderr
  assert "5" in os.listdir(ckpt_dir)  # the SIGTERM save (no periodic save was due)
  stderr = _finish(_cli(workdir))  # resumes from 5
  # What runs, in one line at the start, and the run's summary at the end.
  assert (
    "Run supervised | model 3 layers, hidden 64, MLA, 8 experts top-2: " in stderr
    and "steps 6-6, resumed at 5" in stderr
  )
  for line in (
    "Run summary: steps 6-6 done",
    "validation loss  final",
    f"checkpoint       {ckpt_dir}/6",
    f"metrics          {workdir}/metrics.jsonl",
    "tokens/s (median of 1 records)",
  ):
    assert line in stderr, (line, stderr[-3000:])

  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records] == list(range(1, TOTAL_STEPS + 1))
  full = full_run[1]
  assert _losses(records) == _losses(full)  # float equality, every step
  assert records[-1]["eval_loss"] == full[-1]["eval_loss"]
  with open(os.path.join(workdir, "metrics.jsonl.torn")) as f:
    assert f.read() == '{"step": 7, "loss": 0.12\n'
  assert not os.path.exists(os.path.join(workdir, ".lock"))
