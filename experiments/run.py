"""Command-line entry point: `python -m experiments.run --config=CONFIG.py [--workdir=DIR]`.

    python -m experiments.run --config=experiments/configs/default.py
    python -m experiments.run --config=experiments/configs/default.py --config.train.steps=50 \
        --workdir=/tmp/run1

`--workdir` defaults to `workdir/<config file name>`; running again with the same workdir
resumes from its newest checkpoint. Every config field can be overridden with
`--config.<section>.<field>=<value>`. `config.program` picks what runs (`PROGRAMS`): 'lm'
the supervised `train.loop`, 'rl' the RL program of the environment named by `config.env.name`
(`RL_PROGRAMS`; e.g. `rl_tool_feedback.py`: warm-up, then RL through `composer_jax.rl.run`). Bad
input (unknown config file or field, bad value, a workdir holding another model's
checkpoint, an empty data path) exits with a one-line error.

Multi-process runs: every process runs this command with the same config and workdir (on a
filesystem all processes share) plus `--coordinator=HOST:PORT --num_processes=N
--process_id=I`, or none of these under SLURM `srun` or on a TPU VM, where they are detected
(`composer_jax.parallel.distributed`). The launchers in `launch/` do this.
"""

import glob
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from composer_jax.parallel import distributed
from composer_jax.train import loop
from experiments.tool_feedback import program as tool_feedback

# RL experiment programs, by environment name (`config.env.name`).
RL_PROGRAMS = {"tools": tool_feedback.run}


def _rl(config, workdir: str):
  if config.env.name not in RL_PROGRAMS:
    raise ValueError(f"env.name={config.env.name!r}; valid: {sorted(RL_PROGRAMS)}")
  return RL_PROGRAMS[config.env.name](config, workdir)


PROGRAMS = {"lm": loop.train, "rl": _rl}


def _define_config_flag():
  try:
    default = os.path.join(os.path.dirname(__file__), "configs", "default.py")
    return config_flags.DEFINE_config_file("config", default,
                                           "Experiment config file (Python, get_config()).",
                                           lock_config=True)
  except (AttributeError, KeyError) as e:  # An override naming a field that does not exist.
    overrides = " ".join(a for a in sys.argv[1:] if a.startswith("--config."))
    cause = e.__context__ if isinstance(e.__context__, KeyError) else e
    field, _, hint = str(cause.args[0]).partition("\n")
    sys.exit(f"error: unknown config field {field} in {overrides}. {hint}".rstrip())


_CONFIG = _define_config_flag()
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Run directory: checkpoints, metrics.jsonl, tensorboard/. "
                               "Default: workdir/<config file name>.")
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
  path = config_flags.get_config_filename(flags.FLAGS["config"])
  try:
    config = _CONFIG.value
    config.keys()  # The config file is loaded lazily: fail here, not deep in the trainer.
  except OSError as e:
    reason = "no such file" if not os.path.isfile(path) else str(e).strip().splitlines()[-1]
    available = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "configs", "*.py")))
    names = [n for n in map(os.path.basename, available)
             if n not in ("__init__.py", "base.py", "layouts.py")]  # Not runnable on their own.
    sys.exit(f"error: cannot load config file {path!r}: {reason}; configs in "
             f"experiments/configs/: {', '.join(names)}")
  name = os.path.splitext(os.path.basename(path))[0]
  workdir = _WORKDIR.value or os.path.join("workdir", name)
  try:
    if config.program not in PROGRAMS:
      raise ValueError(f"program={config.program!r}; valid: {sorted(PROGRAMS)}")
    PROGRAMS[config.program](config, workdir)
  except (ValueError, FileNotFoundError, loop.NonFiniteLossError) as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  app.run(main)
