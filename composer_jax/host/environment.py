"""The environment is input too: JAX's and XLA's variables checked at start, with no JAX.

`check()` raises one line (`EnvironmentSettingError`, a ValueError) for the first variable that
would make JAX fail later with a traceback, a C++ abort or a silently different run, saying
what to set instead:

* `JAX_PLATFORMS`: every name a JAX backend (`cpu`, `cuda`, `gpu`, `rocm`, `tpu`) whose
  runtime is installed (the CUDA/ROCm plugin, libtpu); a backend installed but without a
  working device fails when JAX starts it, and `backend_error` turns that error into a line.
* `XLA_FLAGS`: every entry a flag this XLA knows (XLA aborts the process on an unknown one):
  looked up among the flag names compiled into jaxlib and any installed plugin (about 0.05 s
  per flag); `--xla_force_host_platform_device_count` an integer >= 1.
* `JAX_ENABLE_X64`: must be off. The code's dtypes are float32/bfloat16 with int32 indices and
  its checkpoints float32; 64-bit mode would change them all (float64 parameters, int64 steps).

The JAX programs (`experiments.run`, `experiments.eval`, the figures, the HF tools) call it
first; the coding-task tools import no JAX and so none of these variables touch them.
"""

from __future__ import annotations

import glob
import importlib.util
import mmap
import os
import shlex
from collections.abc import Mapping

BACKENDS = ("cpu", "cuda", "gpu", "rocm", "tpu")
# Where each backend's runtime lives (any one found is enough).
_CUDA = ("jax_cuda13_pjrt", "jax_cuda12_pjrt", "jax_cuda13_plugin", "jax_cuda12_plugin")
_ROCM = ("jax_rocm7_pjrt", "jax_rocm60_pjrt", "jax_rocm7_plugin", "jax_rocm60_plugin")
_RUNTIMES = {"cuda": _CUDA, "gpu": _CUDA + _ROCM, "rocm": _ROCM, "tpu": ("libtpu",)}
_PIP = {"cuda": "jax[cuda12]", "gpu": "jax[cuda12]", "rocm": "jax[rocm]", "tpu": "jax[tpu]"}
_DEVICE_COUNT = "xla_force_host_platform_device_count"
_FALSE = ("", "0", "false", "no", "off")


class EnvironmentSettingError(ValueError):
  """An environment variable JAX or XLA cannot run with."""


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):
    return False


def _check_platforms(value: str) -> None:
  names = [n.strip() for n in value.split(",") if n.strip()]
  for name in names:
    if name.lower() not in BACKENDS:
      raise EnvironmentSettingError(
        f"JAX_PLATFORMS={value!r} names {name!r}, not a JAX backend; valid: "
        f"{', '.join(BACKENDS)} (comma-separated, first available wins), or unset it"
      )
  runtimes = {n: _RUNTIMES.get(n.lower()) for n in names}
  if names and all(r is not None and not any(map(_installed, r)) for r in runtimes.values()):
    name = names[0].lower()
    raise EnvironmentSettingError(
      f"JAX_PLATFORMS={value!r}: no {name} runtime is installed here (none of "
      f"{', '.join(_RUNTIMES[name])}); set JAX_PLATFORMS=cpu, unset it (JAX picks what is present) or pip install "
      f"'{_PIP[name]}'"
    )


def _libraries() -> list[str]:
  """The shared libraries holding XLA's flag names: jaxlib's largest, and each plugin's."""
  found = []
  for module in ("jaxlib", *sorted({m for ms in _RUNTIMES.values() for m in ms})):
    try:
      spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
      continue
    if spec is None or not spec.submodule_search_locations:
      continue
    for root in spec.submodule_search_locations:
      sos = glob.glob(os.path.join(root, "**", "*.so"), recursive=True)
      if sos:
        found.append(max(sos, key=os.path.getsize))
  return found


def _known_to_xla(name: str, libraries: list[str]) -> bool:
  needle = name.encode()
  for path in libraries:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
      if m.find(b"\0" + needle + b"\0") >= 0 or m.find(needle) >= 0:
        return True
  return False


def _check_xla_flags(value: str) -> None:
  try:
    entries = shlex.split(value)
  except ValueError as e:
    raise EnvironmentSettingError(f"XLA_FLAGS={value!r} does not parse ({e})") from None
  libraries = None
  for entry in entries:
    name, _, arg = entry.lstrip("-").partition("=")
    if not entry.startswith("--") or not name:
      raise EnvironmentSettingError(
        f"XLA_FLAGS entry {entry!r} is not --name=value; fix or remove it"
      )
    if name == _DEVICE_COUNT:
      if not (arg.strip().isdigit() and int(arg) >= 1):
        raise EnvironmentSettingError(
          f"XLA_FLAGS --{_DEVICE_COUNT}={arg} must be an integer >= 1 (the number of CPU "
          "devices to fake), or leave it out"
        )
      continue
    if libraries is None:
      libraries = _libraries()
    if libraries and not _known_to_xla(name, libraries):
      raise EnvironmentSettingError(
        f"XLA_FLAGS entry {entry!r}: XLA has no flag --{name} (it would abort at start); "
        "check the name against this jaxlib's flags or remove it"
      )


def check(environ: Mapping[str, str] | None = None) -> None:
  """Raises EnvironmentSettingError (one line) for the first variable JAX cannot run with."""
  env = os.environ if environ is None else environ
  if env.get("JAX_PLATFORMS"):
    _check_platforms(env["JAX_PLATFORMS"])
  if env.get("XLA_FLAGS", "").strip():
    _check_xla_flags(env["XLA_FLAGS"])
  if env.get("JAX_ENABLE_X64", "").strip().lower() not in _FALSE:
    raise EnvironmentSettingError(
      f"JAX_ENABLE_X64={env['JAX_ENABLE_X64']!r}: this code runs in float32/bfloat16 with "
      "int32 indices and 64-bit mode would change its dtypes and checkpoints; unset it (or "
      "set JAX_ENABLE_X64=0)"
    )


def backend_error(e: Exception) -> str:
  """One line for JAX's failure to start a backend (`jax.devices()` raising RuntimeError)."""
  first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  platforms = os.environ.get("JAX_PLATFORMS", "")
  return (
    f"JAX could not start its backend (JAX_PLATFORMS={platforms!r}): {first}; set "
    "JAX_PLATFORMS=cpu to run on the CPU, or unset it to use what is present"
  )


def exit_if_unusable() -> None:
  """`check()`, or exit with its line (`error: ...`, status 1): an entry point's first call."""
  try:
    check()
  except EnvironmentSettingError as e:
    raise SystemExit(f"error: {e}") from None
