"""2 processes x 4 devices == 1 process x 8 devices for the RL update (JAX multi-controller on
CPU: `jax.distributed` with a local coordinator, cross-process collectives over gloo)."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from composer_jax.model import transformer
from composer_jax.train import loop
from tests.rl import layouts_test

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LAYOUT = "fsdp_ep"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow  # ~40 s on 2 cores: two processes compile the sharded update, and this one
def test_two_processes_match_one(tmp_path):
  out = str(tmp_path / "update.npz")
  coordinator = f"localhost:{_free_port()}"
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
  procs = [subprocess.Popen(
    [sys.executable, "-m", "tests.rl.multiprocess_update", LAYOUT, coordinator, "2", str(i),
     out], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for i in range(2)]
  init = jax.device_get(transformer.init(
    loop.model_config(layouts_test._config("single")), jax.random.key(0)))
  want_metrics, want_params, _, _ = layouts_test._update(LAYOUT, init)
  for p in procs:
    log, _ = p.communicate(timeout=900)
    assert p.returncode == 0, log[-5000:]
  got = np.load(out)
  assert want_metrics["num_distilled_tokens"] > 0
  for k, v in want_metrics.items():
    np.testing.assert_allclose(got[f"metrics/{k}"], v, rtol=1e-5, atol=1e-6, err_msg=k)
  for path, x in jax.tree_util.tree_leaves_with_path(jax.device_get(want_params)):
    key = f"params{jax.tree_util.keystr(path)}"
    np.testing.assert_allclose(got[key], x, rtol=1e-5, atol=1e-5, err_msg=key)
