"""Precompiled programs: saved once, loaded (not traced) by a new instance, keyed safely."""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.train import compile_cache


def _step(traces):
  """A new step function (jax's in-memory caches never know it) that counts its traces."""

  def step(state, x):
    traces.append(1)
    return {"w": state["w"] - 0.1 * x.sum(0)}, jnp.tanh(state["w"]) @ x.T

  return step


def _args(rows=3):
  """Committed to one device, as the trainer's state and batches are (placed arrays)."""
  rng = np.random.default_rng(0)
  return jax.device_put(({"w": rng.standard_normal(4).astype(np.float32)},
                         rng.standard_normal((rows, 4)).astype(np.float32)), jax.devices()[0])


def _reference(state, x):  # numpy, by hand
  w = np.asarray(state["w"])
  return {"w": w - 0.1 * np.asarray(x).sum(0)}, np.tanh(w) @ np.asarray(x).T


def _precompiled(traces, directory, settings="s"):
  return compile_cache.Precompiled(_step(traces), "step", settings,
                                   donate_argnums=(0,), directory=str(directory))


def _files(directory):
  return sorted(os.listdir(os.path.join(directory, "aot")))


def test_saved_then_loaded_without_tracing(tmp_path):
  traces = []
  want = _reference(*_args())
  chex.assert_trees_all_close(_precompiled(traces, tmp_path)(*_args()), want, rtol=1e-6)
  assert len(traces) == 1 and len(_files(tmp_path)) == 1
  # A new instance (as in a new process) loads the executable: no trace, same result.
  chex.assert_trees_all_close(_precompiled(traces, tmp_path)(*_args()), want, rtol=1e-6)
  assert len(traces) == 1


def test_other_settings_or_shapes_compile_anew(tmp_path):
  traces = []
  _precompiled(traces, tmp_path)(*_args())
  _precompiled(traces, tmp_path, settings="other")(*_args())
  got = _precompiled(traces, tmp_path)(*_args(rows=5))
  chex.assert_trees_all_close(got, _reference(*_args(rows=5)), rtol=1e-6)
  assert len(traces) == 3 and len(_files(tmp_path)) == 3


def test_unreadable_entry_is_recompiled(tmp_path):
  traces = []
  _precompiled(traces, tmp_path)(*_args())
  (path,) = _files(tmp_path)
  with open(os.path.join(tmp_path, "aot", path), "wb") as f:
    f.write(b"truncated")
  got = _precompiled(traces, tmp_path)(*_args())
  chex.assert_trees_all_close(got, _reference(*_args()), rtol=1e-6)
  assert len(traces) == 2
