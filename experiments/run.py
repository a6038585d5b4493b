"""Command-line entry point: `python -m experiments.run --config=CONFIG.py [--workdir=DIR]`.

    python -m experiments.run --config=experiments/configs/default.py
    python -m experiments.run --config=experiments/configs/default.py --config.train.steps=50 \
        --workdir=/tmp/run1

`--workdir` defaults to `workdir/<config file name>`; running again with the same workdir
resumes from its newest checkpoint. Every config field can be overridden with
`--config.<section>.<field>=<value>`. `config.method` picks what runs (`METHODS`): 'lm'
the supervised `train.loop`, 'rl' the RL experiment of the environment named by `config.env.name`
(`RL_EXPERIMENTS`; e.g. `rl_tool_feedback.py`: warm-up, then RL through `composer_jax.rl.run`). Bad
input (unknown, broken or non-run config file, unknown field, a value of the wrong type or out
of its range (`configs.base.check_numbers`), a workdir holding
another model's checkpoint, a workdir that is a file or read-only, an empty data path) exits
with a one-line error. A running job holds `<workdir>/.lock` (`train.workdir_lock`): a second
run on the same workdir stops with one line naming the holder.

Multi-process runs: every process runs this command with the same config and workdir (on a
filesystem all processes share) plus `--coordinator=HOST:PORT --num_processes=N
--process_id=I`, or none of these under SLURM `srun` or on a TPU VM, where they are detected
(`composer_jax.parallel.distributed`). The launchers in `launch/` do this.
"""

import importlib
import os
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from composer_jax.host import environment
from composer_jax.parallel import backend, distributed
from composer_jax.train import checkpointing, compile_cache, host_memory, loop, workdir_lock
from experiments.config_cli import CONFIG_DIR, config_arg, config_error, run_configs
from experiments.configs import base

# RL experiments, by environment name (`config.env.name`): the module whose `run(config,
# workdir)` runs it, imported only when selected, so a supervised run loads no environment
# (the coding one needs the `[coding]` extra).
RL_EXPERIMENTS = {
  "toolcall": "experiments.tool_feedback.program",
  "coding": "experiments.coding.program",
}


def _rl(config, workdir: str):
  if config.env.name not in RL_EXPERIMENTS:
    raise ValueError(f"env.name={config.env.name!r}; valid: {sorted(RL_EXPERIMENTS)}")
  return importlib.import_module(RL_EXPERIMENTS[config.env.name]).run(config, workdir)


METHODS = {"lm": loop.train, "rl": _rl}


def _define_config_flag():
  try:
    return config_flags.DEFINE_config_file(
      "config",
      os.path.join(CONFIG_DIR, "default.py"),
      "Experiment config file (Python, get_config()).",
      lock_config=True,
    )
  except (AttributeError, KeyError) as e:  # An override naming a field that does not exist.
    sys.exit(f"error: {config_error(sys.argv, e)}")


def _parse_flags(argv):
  """absl flag parsing; a config that fails to load or override exits with one line."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    if not str(e).startswith("flag --config="):  # Other flags, and bad override values.
      sys.exit(f"error: {str(e).strip().splitlines()[0]}")
    sys.exit(f"error: {config_error(argv, e)}")
  except Exception as e:  # Any failure inside the config file's code.
    sys.exit(f"error: {config_error(argv, e)}")


def _load_config(argv):
  """The run config, loaded (lazily loaded configs fail here, not deep in the trainer)."""
  try:
    config = _CONFIG.value
    keys = config.keys()
  except Exception as e:  # As above: a lazily loaded config fails here.
    sys.exit(f"error: {config_error(argv, e)}")
  if "method" not in keys:
    sys.exit(
      f"error: {config_arg(argv)!r} is not a run config (it sets no `method`, one of "
      f"{sorted(METHODS)}); {run_configs()}"
    )
  try:  # Every number in range, for every program, before any work.
    base.check_numbers(config)
  except ValueError as e:
    sys.exit(f"error: {e}")
  return config


_CONFIG = _define_config_flag()
_WORKDIR = flags.DEFINE_string(
  "workdir",
  None,
  "Run directory: checkpoints, metrics.jsonl, tensorboard/. Default: workdir/<config file name>.",
)
_COORDINATOR = flags.DEFINE_string(
  "coordinator", None, "Multi-process: HOST:PORT of process 0's coordinator service."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-process: process count.")
_PROCESS_ID = flags.DEFINE_integer(
  "process_id", None, "Multi-process: this process's index in [0, num_processes)."
)
_INIT_TIMEOUT_S = flags.DEFINE_float(
  "init_timeout_s",
  300.0,
  "Multi-process: seconds start-up may wait for every process to join (then one line, exit 1).",
  lower_bound=0.001,
)
_LOCAL_DEVICE_IDS = flags.DEFINE_string(
  "local_device_ids",
  None,
  "Multi-process: the accelerators this process uses, e.g. "
  "0,1,2,3 (default: all, or SLURM's choice).",
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  environment.exit_if_unusable()  # JAX_PLATFORMS, XLA_FLAGS, JAX_ENABLE_X64: one line each
  host_memory.keep_freed_memory()  # First: before JAX starts (host_memory says why).
  host_memory.run_on_calling_thread()
  try:  # Before anything touches a JAX backend.
    distributed.initialize(
      distributed.Settings(
        coordinator=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        local_device_ids=distributed.parse_device_ids(_LOCAL_DEVICE_IDS.value),
        timeout_s=_INIT_TIMEOUT_S.value,
      )
    )
  except ValueError as e:
    sys.exit(f"error: {e}")
  backend.start_or_exit()
  config = _load_config(sys.argv)
  path = config_flags.get_config_filename(flags.FLAGS["config"])
  name = os.path.splitext(os.path.basename(path))[0]
  workdir = _WORKDIR.value or os.path.join("workdir", name)
  try:
    # One job per workdir; multi-process runs share it, so process 0 holds the lock.
    lock = workdir_lock.acquire(workdir) if jax.process_index() == 0 else None
    try:
      if config.method not in METHODS:
        raise ValueError(f"method={config.method!r}; valid: {sorted(METHODS)}")
      checkpointing.check_directory(workdir)  # A file there would fail the first save.
      # Before anything compiles, for every method (an experiment's own runs use the same one).
      compile_cache.enable(compile_cache.cache_dir(config.train.compile_cache_dir, workdir))
      METHODS[config.method](config, workdir)
    finally:
      if lock:
        workdir_lock.release(lock)
  except loop.Preempted as e:  # checkpoint saved; the job system restarts the run
    logging.info("%s", e)
  except (
    ValueError,
    OSError,
    workdir_lock.WorkdirLockedError,
    loop.NonFiniteLossError,
    checkpointing.NonFiniteStateError,
  ) as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
