"""Command-line entry point: `python -m experiments.run --config=CONFIG.py [--workdir=DIR]`.

    python -m experiments.run --config=experiments/configs/default.py
    python -m experiments.run --config=experiments/configs/default.py --config.train.steps=50 \
        --workdir=/tmp/run1

`--workdir` defaults to `workdir/<config file name>`; running again with the same workdir
resumes from its newest checkpoint. Every config field can be overridden with
`--config.<section>.<field>=<value>`. Bad input (unknown config file or field, bad value,
a workdir holding another model's checkpoint, an empty data path) exits with a one-line
error.
"""

import glob
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from composer_jax.train import loop


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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
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
    loop.train(config, workdir)
  except (ValueError, FileNotFoundError, loop.NonFiniteLossError) as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  app.run(main)
