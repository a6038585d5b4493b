"""Command-line entry point: `python -m experiments.run --config=CONFIG.py [--workdir=DIR]`.

    python -m experiments.run --config=experiments/configs/default.py
    python -m experiments.run --config=experiments/configs/default.py --config.train.steps=50 \
        --workdir=/tmp/run1

`--workdir` defaults to `workdir/<config file name>`; running again with the same workdir
resumes from its newest checkpoint. Every config field can be overridden with
`--config.<section>.<field>=<value>`. `config.program` picks what runs (`PROGRAMS`): 'lm'
the supervised `train.loop`, 'rl' the RL program of the environment named by `config.env.name`
(`RL_PROGRAMS`; e.g. `rl_tool_feedback.py`: warm-up, then RL through `composer_jax.rl.run`). Bad
input (unknown, broken or non-run config file, unknown field, bad value, a workdir holding
another model's checkpoint, a workdir that is a file or read-only, an empty data path) exits
with a one-line error. A running job holds `<workdir>/.lock` (`train.workdir_lock`): a second
run on the same workdir stops with one line naming the holder.

Multi-process runs: every process runs this command with the same config and workdir (on a
filesystem all processes share) plus `--coordinator=HOST:PORT --num_processes=N
--process_id=I`, or none of these under SLURM `srun` or on a TPU VM, where they are detected
(`composer_jax.parallel.distributed`). The launchers in `launch/` do this.
"""

import os
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from composer_jax.parallel import distributed
from composer_jax.train import checkpointing, compile_cache, host_memory, loop, workdir_lock
from experiments.coding import program as coding
from experiments.config_cli import CONFIG_DIR, config_arg, config_error, run_configs
from experiments.tool_feedback import program as tool_feedback

# RL experiment programs, by environment name (`config.env.name`).
RL_PROGRAMS = {"tools": tool_feedback.run, "coding": coding.run}


def _rl(config, workdir: str):
  if config.env.name not in RL_PROGRAMS:
    raise ValueError(f"env.name={config.env.name!r}; valid: {sorted(RL_PROGRAMS)}")
  return RL_PROGRAMS[config.env.name](config, workdir)


PROGRAMS = {"lm": loop.train, "rl": _rl}


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
  if "program" not in keys:
    sys.exit(
      f"error: {config_arg(argv)!r} is not a run config (it sets no `program`, one of "
      f"{sorted(PROGRAMS)}); {run_configs()}"
    )
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
_LOCAL_DEVICE_IDS = flags.DEFINE_string(
  "local_device_ids",
  None,
  "Multi-process: the accelerators this process uses, e.g. "
  "0,1,2,3 (default: all, or SLURM's choice).",
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  host_memory.keep_freed_memory()  # First: before JAX starts (host_memory says why).
  host_memory.run_on_calling_thread()
  try:  # Before anything touches a JAX backend.
    distributed.initialize(
      distributed.Settings(
        coordinator=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        local_device_ids=distributed.parse_device_ids(_LOCAL_DEVICE_IDS.value),
      )
    )
  except ValueError as e:
    sys.exit(f"error: {e}")
  config = _load_config(sys.argv)
  path = config_flags.get_config_filename(flags.FLAGS["config"])
  name = os.path.splitext(os.path.basename(path))[0]
  workdir = _WORKDIR.value or os.path.join("workdir", name)
  try:
    # One job per workdir; multi-process runs share it, so process 0 holds the lock.
    lock = workdir_lock.acquire(workdir) if jax.process_index() == 0 else None
    try:
      if config.program not in PROGRAMS:
        raise ValueError(f"program={config.program!r}; valid: {sorted(PROGRAMS)}")
      # Before anything compiles, for every program (a program's own runs use the same one).
      compile_cache.enable(compile_cache.cache_dir(config.train.compile_cache_dir, workdir))
      PROGRAMS[config.program](config, workdir)
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
