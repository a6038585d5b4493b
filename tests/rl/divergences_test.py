"""Tests for composer_jax.rl.divergences against independent numpy references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from composer_jax.model.vocab_chunks import Logits, single
from composer_jax.rl import divergences

N, V = 6, 11


_log_softmax = functools.partial(special.log_softmax, axis=-1)


def _np_div(kind, lp, lq, beta):
  p, q = np.exp(lp), np.exp(lq)
  if kind == "reverse_kl":
    return (p * (lp - lq)).sum(-1)
  if kind == "forward_kl":
    return (q * (lq - lp)).sum(-1)
  m = beta * q + (1 - beta) * p
  return beta * (q * np.log(q / m)).sum(-1) + (1 - beta) * (p * np.log(p / m)).sum(-1)


def _np_topk_tail(zs, zt, k):
  lp, lq = _log_softmax(zs), _log_softmax(zt)
  idx = np.argsort(-zs, axis=-1)[:, :k]
  pk, qk = np.take_along_axis(lp, idx, -1), np.take_along_axis(lq, idx, -1)
  tail = lambda x: np.log(1 - np.exp(x).sum(-1, keepdims=True))
  return np.concatenate([pk, tail(pk)], -1), np.concatenate([qk, tail(qk)], -1)


@pytest.fixture(scope="module")
def logits():
  rng = np.random.default_rng(0)
  # D = V and head = identity, so the hidden states ARE the logits (gradients w.r.t. logits).
  zs = rng.normal(size=(N, V)) * 2
  zt = zs + rng.normal(size=(N, V))
  y = rng.integers(0, V, size=N)
  return zs.astype(np.float32), zt.astype(np.float32), y.astype(np.int32)


def _run(zs, zt, y, **kw):
  return _run_jit(zs, zt, y, **kw)


@functools.partial(jax.jit, static_argnames=("kind", "support", "beta", "top_k", "chunk_size"))
def _run_jit(zs, zt, y, **kw):
  eye = jnp.eye(V)
  return divergences.token_divergence(single(zs, eye), single(zt, eye), y, **kw)


@pytest.mark.parametrize("kind", divergences.DIVERGENCES)
@pytest.mark.parametrize("support", ["full", "topk"])
def test_divergence_values(logits, kind, support):
  zs, zt, y = logits
  out = _run(zs, zt, y, kind=kind, support=support, beta=0.3, top_k=4, chunk_size=4)
  if support == "full":
    lp, lq = _log_softmax(zs.astype(np.float64)), _log_softmax(zt.astype(np.float64))
  else:
    lp, lq = _np_topk_tail(zs.astype(np.float64), zt.astype(np.float64), 4)
  np.testing.assert_allclose(out["divergence"], _np_div(kind, lp, lq, 0.3), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    out["reverse_kl"], _np_div("reverse_kl", lp, lq, 0), rtol=1e-5, atol=1e-6
  )
  full_lp, full_lq = _log_softmax(zs), _log_softmax(zt)
  np.testing.assert_allclose(out["logp"], full_lp[np.arange(N), y], rtol=1e-5)
  np.testing.assert_allclose(out["logq"], full_lq[np.arange(N), y], rtol=1e-5)
  np.testing.assert_array_equal(out["teacher_argmax"], zt.argmax(-1))


def test_topk_tail_lower_bounds_full(logits):
  zs, zt, y = logits
  kw = dict(kind="reverse_kl", beta=0.3, top_k=4, chunk_size=4)  # compiled by the test above
  full = _run(zs, zt, y, support="full", **kw)["divergence"]
  topk = _run(zs, zt, y, support="topk", **kw)["divergence"]
  assert np.all(np.asarray(topk) <= np.asarray(full) + 1e-6)


def _grad(zs, zt, y, **kw):
  """(grads w.r.t. (student, teacher) logits, outputs) of the summed divergence."""
  f = lambda a, b: (lambda o: (o["divergence"].sum(), o))(_run_jit(a, b, y, **kw))
  return jax.jit(jax.grad(f, argnums=(0, 1), has_aux=True))(zs, zt)


@pytest.mark.parametrize(
  "kind,support", [("reverse_kl", "full"), ("forward_kl", "full"), ("reverse_kl", "sampled")]
)
def test_gradient_is_analytic_and_teacher_gets_none(logits, kind, support):
  zs, zt, y = (x.astype(np.float64) if x.dtype != np.int32 else x for x in logits)
  (g_s, g_t), _ = _grad(*logits, kind=kind, support=support, chunk_size=4)
  lp, lq = _log_softmax(zs), _log_softmax(zt)
  p, q = np.exp(lp), np.exp(lq)
  if kind == "reverse_kl" and support == "full":
    kl = (p * (lp - lq)).sum(-1, keepdims=True)
    expected = p * (lp - lq - kl)  # d KL(p||q) / d z_s
  elif kind == "forward_kl":
    expected = p - q
  else:
    d = (lp - lq)[np.arange(N), y][:, None]
    expected = d * (np.eye(V)[y] - p)  # d * grad log p(y)
  np.testing.assert_allclose(g_s, expected, rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(g_t, np.zeros_like(zt))


def test_sampled_value_is_k1(logits):
  zs, zt, y = logits
  out = _run(zs, zt, y, kind="reverse_kl", support="sampled")
  lp, lq = _log_softmax(zs), _log_softmax(zt)
  np.testing.assert_allclose(out["divergence"], (lp - lq)[np.arange(N), y], rtol=1e-5)


@pytest.mark.parametrize("support", ["full", "topk"])
def test_chunked_equals_unchunked(logits, support):
  zs, zt, y = logits
  kw = dict(kind="jsd", support=support, top_k=5)
  (ga, _), a = _grad(zs, zt, y, chunk_size=3, **kw)
  (gb, _), b = _grad(zs, zt, y, chunk_size=V, **kw)
  jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6), a, b)
  np.testing.assert_allclose(ga, gb, rtol=1e-5, atol=1e-6)


def test_mixed_teacher_logits(logits):
  zs, zt, y = logits
  eye = jnp.eye(V)
  mixed = Logits((zs, zt), (eye, eye), (0.25, 0.75))
  out = jax.jit(
    lambda a, t: divergences.token_divergence(
      single(a, eye), t, jnp.asarray(y), kind="reverse_kl", support="full", chunk_size=4
    )
  )(zs, mixed)
  lp, lq = _log_softmax(zs), _log_softmax(0.25 * zs + 0.75 * zt)
  np.testing.assert_allclose(out["divergence"], _np_div("reverse_kl", lp, lq, 0), rtol=1e-5)


def test_errors(logits):
  zs, zt, y = logits
  with pytest.raises(ValueError, match="estimates reverse_kl only"):
    _run(zs, zt, y, kind="jsd", support="sampled")
  with pytest.raises(ValueError, match="top_k=11 must be in"):
    _run(zs, zt, y, kind="jsd", support="topk", top_k=11)
  with pytest.raises(ValueError, match="divergence='tv'"):
    _run(zs, zt, y, kind="tv", support="full")


def test_chunked_pass_never_holds_token_by_vocab_logits():
  """Compiled forward + backward scratch memory stays below half of one [N, V] float32 array."""
  n, d, v = 256, 16, 8192
  f = lambda hs, w, ht, y: divergences.token_divergence(
    single(hs, w), single(ht, w), y, kind="jsd", support="full", chunk_size=512
  )["divergence"].sum()
  args = (jnp.zeros((n, d)), jnp.zeros((d, v)), jnp.zeros((n, d)), jnp.zeros(n, jnp.int32))
  compiled = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(*args).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < 0.5 * n * v * 4
