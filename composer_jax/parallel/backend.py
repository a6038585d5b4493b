"""Starting JAX's backend at an entry point: one line instead of a traceback.

The environment itself (`JAX_PLATFORMS`, `XLA_FLAGS`, `JAX_ENABLE_X64`) is checked without JAX
by `host.environment`; this is the step after it, which needs JAX.
"""

import jax

from composer_jax.host import environment


def start_or_exit() -> None:
  """Starts JAX's backend now (`jax.devices()`; after `jax.distributed.initialize` in a
  multi-process run), or exits with one line (`environment.backend_error`) instead of a
  traceback."""
  try:
    jax.devices()
  except RuntimeError as e:
    raise SystemExit(f"error: {environment.backend_error(e)}") from None


def ready_or_exit() -> None:
  """A single-process JAX program's first call: the environment checked, the backend up."""
  environment.exit_if_unusable()
  start_or_exit()
