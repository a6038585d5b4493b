"""`python -m experiments.run` turns bad input into one clear line on stderr and exit code 1."""

import os
import socket
import subprocess
import sys

import grain
import numpy as np
import pytest

from composer_jax.model.config import get_preset
from composer_jax.train import checkpointing, workdir_lock

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


# Runs experiments.run with every write under a path (argv[1]) failing as on a read-only
# mount (tests run as root, for whom chmod does not stop writes).
_READ_ONLY = """
import builtins, os, runpy, sys
root = sys.argv.pop(1)
def _guard(real, is_write):
  def f(path, *a, **k):
    if is_write(a, k) and os.path.abspath(str(path)).startswith(root):
      raise PermissionError(13, "Permission denied", str(path))
    return real(path, *a, **k)
  return f
builtins.open = _guard(builtins.open,
                       lambda a, k: any(c in (a[0] if a else k.get("mode", "r")) for c in "wax+"))
os.mkdir = _guard(os.mkdir, lambda a, k: True)
os.open = _guard(os.open, lambda a, k: bool(a[0] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)))
runpy.run_module("experiments.run", run_name="__main__", alter_sys=True)
"""


def _run(*args, read_only=None):
  cmd = ["-c", _READ_ONLY, read_only] if read_only else ["-m", "experiments.run"]
  proc = subprocess.run(
    [sys.executable, *cmd, *args], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  return proc.returncode, proc.stderr.strip().splitlines()[-1], proc.stderr


def _workdir_of_other_model(path) -> str:
  """A workdir whose checkpoint was written by a tiny model with hidden_size 32."""
  ckpt = checkpointing.Checkpointer(str(path), keep=1)
  ckpt.save(
    1,
    {"x": np.zeros(2, np.float32)},
    iter(grain.MapDataset.range(4).to_iter_dataset()),
    get_preset("tiny", hidden_size=32),
    {},
  )
  ckpt.close()
  return str(path)


_CONFIGS = "configs in experiments/configs/: default.py, kimi_k2_continued.py, "


@pytest.mark.parametrize(
  "case",
  [
    "unknown_field",
    "unknown_model_field",
    "bad_model_value",
    "unknown_config",
    "bad_value",
    "negative_lr",
    "empty_data",
    "other_model",
    "syntax_error",
    "missing_with_override",
    "not_a_run_config",
    "bad_config_arg",
    "unknown_config_option",
    "bad_override_value",
    "not_finite",
    "workdir_is_file",
    "locked",
    "shared_compile_cache",
  ],
)
def test_bad_input_is_one_line_error(case, tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  (tmp_path / "syntax.py").write_text("def get_config(:\n")
  (tmp_path / "file").write_text("")
  locked, shared = tmp_path / "locked", tmp_path / "shared"
  shared.mkdir()
  os.chmod(shared, 0o777)
  if case == "locked":  # The holder is this test process.
    lock = workdir_lock.acquire(str(locked))
  args, expected = {
    "unknown_field": (
      ["--config.train.stepz=1"],
      "unknown config field 'stepz' in --config.train.stepz=1. Did you mean \"steps\"",
    ),
    "unknown_model_field": (
      ["--config.model.num_layerz=2"],
      "unknown config field 'num_layerz' in --config.model.num_layerz=2. Did you mean "
      '"num_layers"',
    ),
    "bad_model_value": (["--config.model.num_heads=0"], "num_heads=0 must be > 0"),
    "unknown_config": (
      ["--config=experiments/configs/nope.py"],
      "cannot load config file 'experiments/configs/nope.py': no such file; "
      "configs in experiments/configs/: ",
    ),
    "bad_value": (["--config.train.steps=0"], "train.steps=0 must be >= 1"),
    "negative_lr": (
      ["--config.optim.lr=-0.1"],
      "optim.lr=-0.1 must be finite and >= 0 (a negative rate would ascend the loss)",
    ),
    "empty_data": ([f"--config.data.paths={empty}"], "has no"),
    "other_model": (
      [f"--workdir={_workdir_of_other_model(tmp_path / 'w')}"],
      "different model config: hidden_size (checkpoint 32, config 64)",
    ),
    "syntax_error": (
      [f"--config={tmp_path}/syntax.py"],
      f"cannot load config file '{tmp_path}/syntax.py': SyntaxError: invalid syntax (line 1)",
    ),
    "missing_with_override": (
      ["--config=nope.py", "--config.train.steps=3"],
      f"cannot load config file 'nope.py': no such file; {_CONFIGS}",
    ),
    "not_a_run_config": (
      ["--config=experiments/configs/layouts.py"],
      "'experiments/configs/layouts.py' is not a run config (it sets no "
      f"`method`, one of ['lm', 'rl']); {_CONFIGS}",
    ),
    "bad_config_arg": (
      ["--config=experiments/configs/rl_tool_feedback.py:bad"],
      "'experiments/configs/rl_tool_feedback.py:bad': ValueError: arm='bad'; valid: "
      "KIND[_VARIANT][_TEACHER][@SD_COEF], KIND in ['both', 'lr0', 'penalty', 'rl', 'sd']",
    ),
    "unknown_config_option": (
      ["--config=experiments/configs/rl_tool_feedback.py:sd,fsdp_ep"],
      "'experiments/configs/rl_tool_feedback.py:sd,fsdp_ep': ValueError: config arg "
      "'sd,fsdp_ep': 'fsdp_ep' is not an option (key=value, the first option's value alone "
      "first); options (defaults): arm='sd', behaviour='tools', layout='single'",
    ),
    "bad_override_value": (
      ["--config.train.steps=abc"],
      "flag --config.train.steps=abc: invalid literal for int()",
    ),
    "not_finite": (["--config.optim.grad_clip=nan"], "optim.grad_clip=nan must be finite"),
    "workdir_is_file": (
      [f"--workdir={tmp_path / 'file'}"],
      f"--workdir {tmp_path / 'file'}: cannot write there: it is a regular file, not a directory",
    ),
    "locked": (
      [f"--workdir={locked}"],
      f"--workdir {locked} is in use by pid {os.getpid()} on host '{socket.gethostname()}'",
    ),
    "shared_compile_cache": (
      [f"--config.train.compile_cache_dir={shared}"],
      f"train.compile_cache_dir {shared} is writable by its group or others (mode "
      "drwxrwxrwx): a compiled program read from it runs as this user",
    ),
  }[case]
  if not any(a.startswith("--workdir") for a in args):
    args.append(f"--workdir={tmp_path / 'work'}")
  try:
    rc, last, stderr = _run(*args)
  finally:
    if case == "locked":
      workdir_lock.release(lock)
  assert rc == 1, stderr
  assert last.startswith("error: ") and expected in last, stderr
  assert "Traceback" not in stderr, stderr


@pytest.mark.parametrize("holds_checkpoints", [False, True])
def test_read_only_workdir_is_one_line_error(holds_checkpoints, tmp_path):
  workdir = str(tmp_path / "w")
  if holds_checkpoints:
    _workdir_of_other_model(workdir)
  rc, last, stderr = _run(f"--workdir={workdir}", read_only=str(tmp_path))
  assert rc == 1, stderr
  assert last == (
    f"error: --workdir {workdir}: cannot write there: Permission denied "
    "(PermissionError); pass a writable directory (new, or holding this run's "
    "checkpoints)"
  ), stderr
  assert "Traceback" not in stderr, stderr
  if holds_checkpoints:  # Nothing already written is lost.
    ckpt = checkpointing.Checkpointer(workdir, keep=1)
    assert ckpt.all_steps() == [1]
    ckpt.close()


def test_dry_run_prints_memory_plan():
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.run",
      "--config=experiments/configs/kimi_k2_continued.py",
      "--config.train.dry_run=True",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  assert "Memory plan on 1024 devices" in proc.stdout
  assert "params" in proc.stdout and "opt_state" in proc.stdout and "GiB" in proc.stdout
