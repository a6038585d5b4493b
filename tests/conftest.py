"""Every test sees 8 fake CPU devices (set before jax is imported anywhere)."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_configure(config):
  assert jax.device_count() == 8, f"expected 8 fake CPU devices, got {jax.devices()}"
