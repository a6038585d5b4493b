"""The `--config` flag's errors, shared by the commands that take a run config with
ml_collections config flags (`experiments.run`, `experiments.eval`): one line for a config file
that does not load, is not a run config, or an override naming a field it does not have."""

import glob
import os

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "configs")
_NOT_RUN_CONFIGS = ("__init__.py", "base.py", "layouts.py")  # Not runnable on their own.


def run_configs() -> str:
  names = sorted(map(os.path.basename, glob.glob(os.path.join(CONFIG_DIR, "*.py"))))
  return "configs in experiments/configs/: " + ", ".join(
    n for n in names if n not in _NOT_RUN_CONFIGS
  )


def config_arg(argv, default: str = "default.py") -> str:
  """The `--config` value on the command line (`FILE.py[:ARG]`), else the default file."""
  for a in argv:
    if a.startswith(("--config=", "-config=")):
      return a.split("=", 1)[1]
  return os.path.relpath(os.path.join(CONFIG_DIR, default))


def config_error(argv, e: BaseException, default: str = "default.py") -> str:
  """One line for a config that does not load or an override that does not apply (`default`:
  the file `--config` names when it is not given)."""
  arg = config_arg(argv, default)
  path = arg.split(":", 1)[0]
  overrides = " ".join(a for a in argv[1:] if a.startswith("--config."))
  if isinstance(e, (AttributeError, KeyError)):  # An override naming a missing field.
    cause = e.__context__ if isinstance(e.__context__, KeyError) else e
    field, _, hint = str(cause.args[0]).partition("\n")
    if os.path.isfile(path):
      return f"unknown config field {field} in {overrides}. {hint}".rstrip()
  if not os.path.isfile(path):
    return f"cannot load config file {arg!r}: no such file; {run_configs()}"
  if isinstance(e, SyntaxError):
    return f"cannot load config file {arg!r}: SyntaxError: {e.msg} (line {e.lineno})"
  # Errors raised in get_config arrive as a traceback text: its last line is the error.
  lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
  return f"cannot load config file {arg!r}: {lines[-1] if lines else type(e).__name__}"
