"""Router, dispatch modes and bias update against hand / per-token / HF references."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds

from composer_jax.model import moe, router
from composer_jax.model.config import get_preset
from tests.model import hf_reference

_T, _D, _E, _F, _K = 12, 8, 4, 6, 2


def _cfg(**kw):
  return get_preset(
    "tiny",
    hidden_size=_D,
    n_routed_experts=_E,
    moe_intermediate_size=_F,
    num_experts_per_tok=_K,
    n_group=2,
    topk_group=1,
    **kw,
  )


def _expert_inputs(seed=0):
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.standard_normal(s, dtype=np.float32))
  x, gate, up, down = f(_T, _D), f(_E, _D, _F) / 3, f(_E, _D, _F) / 3, f(_E, _F, _D) / 3
  logits = f(_T, _E)
  weights, experts, _ = router.route(logits, jnp.zeros(_E), _cfg())
  return x, weights, experts, gate, up, down


def _per_token_reference(x, weights, experts, gate, up, down):
  """sum_k w_tk * expert_{e_tk}(x_t), one token and one expert at a time."""
  rows = []
  for t in range(x.shape[0]):
    y = jnp.zeros(x.shape[1])
    for k in range(experts.shape[1]):
      e = int(experts[t, k])
      y += weights[t, k] * (jax.nn.silu(x[t] @ gate[e]) * (x[t] @ up[e])) @ down[e]
    rows.append(y)
  return jnp.stack(rows)


def test_route_matches_hf_router():
  cfg = get_preset("tiny", n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=3)
  rng = np.random.default_rng(0)
  x = rng.standard_normal((10, cfg.hidden_size), dtype=np.float32)
  w = rng.standard_normal((cfg.hidden_size, 16), dtype=np.float32)
  bias = rng.standard_normal(16, dtype=np.float32) * 0.3
  hf = hf_ds.DeepseekV3TopkRouter(hf_reference.hf_config(cfg))
  with torch.no_grad():
    hf.weight.copy_(hf_reference.to_torch(w.T))
    hf.e_score_correction_bias.copy_(hf_reference.to_torch(bias))
    _, want_w, want_idx = hf(hf_reference.to_torch(x))
  weights, experts, _ = router.route(jnp.asarray(x @ w), jnp.asarray(bias), cfg)
  order = np.argsort(np.asarray(experts), axis=-1)  # HF top-k is unsorted
  want_order = np.argsort(want_idx.numpy(), axis=-1)
  chex.assert_trees_all_equal(
    np.take_along_axis(np.asarray(experts), order, -1),
    np.take_along_axis(want_idx.numpy(), want_order, -1),
  )
  chex.assert_trees_all_close(
    np.take_along_axis(np.asarray(weights), order, -1),
    np.take_along_axis(want_w.numpy(), want_order, -1),
    rtol=1e-5,
  )


def test_group_limited_topk_hand_built():
  # 8 experts in 4 groups of 2; keep 2 groups; top-2. Group sums of top-2 (sigmoid):
  # group 0 = {0.99, 0.01} (sum ~1.0), group 1 = {0.7, 0.7} (1.4), group 2 = {0.6, 0.6} (1.2),
  # group 3 = {0.1, 0.1}. Expert 0 has the single best score but its group loses.
  cfg = get_preset(
    "tiny",
    n_routed_experts=8,
    n_group=4,
    topk_group=2,
    num_experts_per_tok=2,
    norm_topk_prob=False,
    routed_scaling_factor=1.0,
  )
  probs = jnp.array([[0.99, 0.01, 0.7, 0.69, 0.6, 0.6, 0.1, 0.1]])
  weights, experts, _ = router.route(jnp.log(probs / (1 - probs)), jnp.zeros(8), cfg)
  assert sorted(np.asarray(experts)[0].tolist()) == [2, 3]
  chex.assert_trees_all_close(np.sort(np.asarray(weights)[0]), np.array([0.69, 0.7]), rtol=1e-5)


def test_bias_changes_selection_not_gate_values():
  cfg = get_preset("tiny", n_group=1, topk_group=1, num_experts_per_tok=2)
  probs = jnp.array([[0.9, 0.8, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1]])
  logits = jnp.log(probs / (1 - probs))
  bias = jnp.zeros(8).at[2].set(1.0)  # pushes expert 2 above expert 1
  w0, e0, _ = router.route(logits, jnp.zeros(8), cfg)
  w1, e1, _ = router.route(logits, bias, cfg)
  assert sorted(np.asarray(e0)[0].tolist()) == [0, 1]
  assert sorted(np.asarray(e1)[0].tolist()) == [0, 2]
  rsf = cfg.routed_scaling_factor
  gates = dict(zip(np.asarray(e1)[0].tolist(), np.asarray(w1)[0].tolist()))
  assert gates[0] == pytest.approx(rsf * 0.9 / 1.2, rel=1e-5)  # unbiased scores 0.9, 0.3
  assert gates[2] == pytest.approx(rsf * 0.3 / 1.2, rel=1e-5)
  assert float(w0.sum()) == pytest.approx(rsf, rel=1e-5)


_DISPATCHES = {
  f"dropless_{impl}": functools.partial(
    moe.dropless, expert_fn=functools.partial(moe.grouped_swiglu, impl=impl)
  )
  for impl in moe.GROUPED_MATMULS
} | {"dense": moe.dense}


@pytest.mark.parametrize("dispatch", sorted(_DISPATCHES))
def test_dispatch_matches_per_token_reference_values_and_grads(dispatch):
  x, weights, experts, gate, up, down = _expert_inputs()
  valid = jnp.ones(_T, bool)
  cot = jnp.asarray(np.random.default_rng(1).standard_normal((_T, _D), dtype=np.float32))
  fn = _DISPATCHES[dispatch]
  got_loss = lambda *a: jnp.sum(fn(a[0], a[1], experts, valid, *a[2:])[0] * cot)
  want_loss = lambda *a: jnp.sum(_per_token_reference(a[0], a[1], experts, *a[2:]) * cot)
  args = (x, weights, gate, up, down)
  got = jax.jit(jax.value_and_grad(got_loss, argnums=range(5)))(*args)
  want = jax.value_and_grad(want_loss, argnums=range(5))(*args)
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)


def _per_row_reference(rows, group_sizes, gate, up, down):
  """Each row through its expert, one row at a time; rows past the groups give 0."""
  row_expert = np.repeat(np.arange(gate.shape[0]), group_sizes)
  want = [
    (jax.nn.silu(rows[i] @ gate[e]) * (rows[i] @ up[e])) @ down[e] for i, e in enumerate(row_expert)
  ]
  pad = jnp.zeros((rows.shape[0] - len(want), rows.shape[1]))
  return jnp.concatenate([jnp.stack(want), pad]) if want else pad


@pytest.mark.parametrize("impl", sorted(moe.GROUPED_MATMULS))
@pytest.mark.parametrize(
  "group_sizes", [[5, 0, 9, 2], [0, 0, 16, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 17, 3, 20]]
)
@pytest.mark.parametrize("tile_rows", [8, 32])
def test_grouped_swiglu_matches_per_row_reference_values_and_grads(impl, group_sizes, tile_rows):
  # Buffers as expert_parallel passes them: empty experts and unused rows past the groups;
  # groups longer than a tile (17, 20 > 8) and tiles wider than the buffer (32 > 40 / 4).
  x, _, _, gate, up, down = _expert_inputs()
  rows = jnp.concatenate([x, x + 1.0, x - 1.0, x * 2.0])[:40]
  cot = jnp.asarray(np.random.default_rng(3).standard_normal(rows.shape, dtype=np.float32))
  sizes = jnp.asarray(group_sizes, jnp.int32)
  fn = functools.partial(moe.grouped_swiglu, impl=impl, tile_rows=tile_rows)
  got_loss = lambda *a: jnp.sum(fn(a[0], sizes, *a[1:]) * cot)
  want_loss = lambda *a: jnp.sum(_per_row_reference(a[0], group_sizes, *a[1:]) * cot)
  args = (rows, gate, up, down)
  got_y = jax.jit(fn)(rows, sizes, gate, up, down)
  got = jax.jit(jax.value_and_grad(got_loss, argnums=range(4)))(*args)
  want = jax.value_and_grad(want_loss, argnums=range(4))(*args)
  chex.assert_trees_all_close(
    got_y, _per_row_reference(*args[:1], group_sizes, *args[1:]), atol=1e-5
  )
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sums", ["chunks", "windows"])
def test_looped_chunks_match_ragged_dot_values_and_grads(sums, monkeypatch):
  # The CPU default against jax.lax.ragged_dot at a chunk size that splits groups (8 rows)
  # and at skewed routing (one expert takes half the rows). Weight gradients summed chunk by
  # chunk (these [16, 12] sums fit CACHED_SUMS_BYTES) or, forced, per window: then the
  # 80-row group sums two windows (over the largest, 8 chunks), the others one of 8 to 64.
  if sums == "windows":
    monkeypatch.setattr(moe.expert_loop, "CACHED_SUMS_BYTES", 0)
  rng = np.random.default_rng(4)
  n, d, f, e = 160, 16, 12, 6
  rows, cot = (jnp.asarray(rng.standard_normal((n, d), dtype=np.float32)) for _ in range(2))
  gate, up = (jnp.asarray(rng.standard_normal((e, d, f), dtype=np.float32)) / 4 for _ in range(2))
  down = jnp.asarray(rng.standard_normal((e, f, d), dtype=np.float32)) / 4
  sizes = jnp.array([80, 0, 13, 9, 1, 50], jnp.int32)  # 153 of 160 rows used
  assert moe.expert_loop.chunk_rows(n, e, 8) == 8
  assert moe.expert_loop.window_rows(8, n) == (8, 16, 32, 64)
  losses = {
    impl: lambda *a, impl=impl: jnp.sum(
      moe.grouped_swiglu(a[0], sizes, *a[1:], impl=impl, tile_rows=8) * cot
    )
    for impl in ("looped", "ragged_dot")
  }
  got, want = (
    jax.jit(jax.value_and_grad(losses[i], argnums=range(4)))(rows, gate, up, down)
    for i in ("looped", "ragged_dot")
  )
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(got[1][0][153:]).max()) == 0.0  # unused rows get no gradient


def test_looped_window_sums_match_per_row_reference_values_and_grads(monkeypatch):
  # The window path (forced) on the edge cases above: empty experts, rows past the groups,
  # no rows at all; one compile, the group sizes are data.
  monkeypatch.setattr(moe.expert_loop, "CACHED_SUMS_BYTES", 0)
  x, _, _, gate, up, down = _expert_inputs()
  rows = jnp.concatenate([x, x + 1.0, x - 1.0, x * 2.0])[:40]
  cot = jnp.asarray(np.random.default_rng(3).standard_normal(rows.shape, dtype=np.float32))
  got_fn = jax.jit(
    jax.value_and_grad(
      lambda r, sizes, *w: jnp.sum(
        moe.grouped_swiglu(r, sizes, *w, impl="looped", tile_rows=8) * cot
      ),
      argnums=(0, 2, 3, 4),
    )
  )
  for group_sizes in ([5, 0, 9, 2], [0, 0, 16, 0], [0, 0, 0, 0], [0, 17, 3, 20]):
    want_loss = lambda *a, sizes=group_sizes: jnp.sum(_per_row_reference(a[0], sizes, *a[1:]) * cot)
    want = jax.value_and_grad(want_loss, argnums=range(4))(rows, gate, up, down)
    got = got_fn(rows, jnp.asarray(group_sizes, jnp.int32), gate, up, down)
    chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)


def test_tile_layout_by_hand():
  # Groups [3, 0, 5] in tiles of 4: expert 0 -> tile 0 (3 rows + 1 pad), expert 2 -> tiles
  # 1, 2 (4 + 1 rows); 9 rows in all, row 8 unused. Static tiles: ceil(9 / 4) + 3 = 6.
  src, dest, tile_expert = moe.tile_layout(jnp.array([3, 0, 5]), 9, 4)
  unused_src, unused_dest = 9, 6 * 4
  want_src = [0, 1, 2, unused_src, 3, 4, 5, 6, 7] + [unused_src] * 15
  chex.assert_trees_all_equal(src, jnp.array(want_src))
  chex.assert_trees_all_equal(dest, jnp.array([0, 1, 2, 4, 5, 6, 7, 8, unused_dest]))
  chex.assert_trees_all_equal(tile_expert, jnp.array([0, 2, 2, 2, 2, 2]))


def test_capacity_large_equals_dropless_and_small_drops():
  x, weights, experts, gate, up, down = _expert_inputs()
  valid = jnp.ones(_T, bool).at[-1].set(False)  # padding takes no capacity, is not dropped
  want, _ = moe.dropless(x, weights, experts, valid, gate, up, down)
  big, dropped = moe.capacity(x, weights, experts, valid, gate, up, down, capacity_factor=float(_E))
  chex.assert_trees_all_close(big[:-1], want[:-1], rtol=1e-5, atol=1e-6)
  assert float(dropped) == 0.0

  factor = 0.5
  small, dropped = moe.capacity(x, weights, experts, valid, gate, up, down, capacity_factor=factor)
  # Hand count: capacity ceil(0.5 * T * K / E); k-major, token-order priority.
  cap = int(np.ceil(factor * _T * _K / _E))
  used, kept = np.zeros(_E, int), np.zeros((_T, _K), bool)
  for k in range(_K):
    for t in range(_T - 1):
      e = int(experts[t, k])
      kept[t, k] = used[e] < cap
      used[e] += 1
  assert float(dropped) == (_T - 1) * _K - kept.sum() > 0
  ref = _per_token_reference(x, weights * kept, experts, gate, up, down)
  chex.assert_trees_all_close(small[:-1], ref[:-1], rtol=1e-5, atol=1e-6)


def test_router_stats_and_balance_loss_by_hand():
  experts = jnp.array([[0, 1], [0, 2], [3, 0], [1, 2]])
  scores = jnp.array(
    [[0.5, 0.25, 0.25, 0.0], [0.5, 0.0, 0.5, 0.0], [0.5, 0.0, 0.0, 0.5], [0.0, 0.5, 0.5, 0.0]]
  )
  valid = jnp.array([True, True, True, False])
  s = router.router_stats(experts, scores, valid)
  chex.assert_trees_all_close(s["router_counts"], jnp.array([3.0, 1.0, 1.0, 1.0]))
  mean_p = np.array([1.5, 0.25, 0.75, 0.5]) / 3
  assert float(s["router_entropy"]) == pytest.approx(-np.sum(mean_p * np.log(mean_p)), rel=1e-6)
  assert float(s["load_max_over_mean"]) == pytest.approx(3 / 1.5)
  # One sequence of 3 valid tokens: f_i = E/(K T) * count_i, P_i = mean normalized score.
  loss = router.balance_loss(experts[None], scores[None], valid[None], coef=0.1)
  f = 4 / (2 * 3) * np.array([3.0, 1.0, 1.0, 1.0])
  assert float(loss) == pytest.approx(0.1 * np.sum(f * mean_p), rel=1e-6)


def test_update_router_bias_by_hand():
  bias = jnp.array([[0.0, 0.1, -0.1, 0.0], [1.0, 1.0, 1.0, 1.0]])
  counts = jnp.array([[10.0, 2.0, 4.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
  # layer 0: mean 5 -> overloaded expert 0 down, the others up; layer 1 balanced: unchanged.
  want = np.array([[-0.01, 0.11, -0.09, 0.01], [1.0, 1.0, 1.0, 1.0]])
  chex.assert_trees_all_close(moe.update_router_bias(bias, counts, 0.01), want, rtol=1e-6)
  with pytest.raises(ValueError, match="counts shape"):
    moe.update_router_bias(bias, counts[:1], 0.01)


def test_moe_module_excludes_padding_from_stats():
  cfg = _cfg(seq_aux_loss_coef=0.01)
  x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 5, _D), dtype=np.float32))
  valid = jnp.array([[True] * 5, [True, True, False, False, False]])
  layer = moe.MoE(cfg)
  variables = jax.jit(layer.init)(jax.random.key(0), x, valid)
  y, stats = jax.jit(layer.apply)(variables, x, valid)
  chex.assert_shape(y, x.shape)
  assert float(stats["router_counts"].sum()) == 7 * _K
  assert float(stats["balance_loss"]) > 0
  assert float(stats["dropped_tokens"]) == 0
