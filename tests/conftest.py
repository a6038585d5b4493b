"""Every test sees 8 fake CPU devices and compiles with LLVM's cheapest settings (both set
before jax is imported anywhere; subprocesses inherit them)."""

import os

from tests.compile_options import CHEAP_XLA_FLAGS

os.environ["XLA_FLAGS"] = (
  f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8 {CHEAP_XLA_FLAGS}"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_configure(config):
  assert jax.device_count() == 8, f"expected 8 fake CPU devices, got {jax.devices()}"


def pytest_collection_modifyitems(items):
  # Modules with slow tests first (each module kept whole, so module fixtures are set up
  # once per worker unless the other worker steals its tail): under `-n 2` the long tests
  # then start early instead of ending the run on one worker while the other idles.
  slow_modules = {item.module for item in items if item.get_closest_marker("slow")}
  items.sort(key=lambda item: item.module not in slow_modules)
