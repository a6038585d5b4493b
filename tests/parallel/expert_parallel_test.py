"""Expert-parallel dispatch on 8 fake CPU devices against the single-device dropless path."""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from composer_jax.model import moe, transformer
from composer_jax.model.config import get_preset
from composer_jax.parallel import context, context_mesh, expert_parallel
from composer_jax.parallel.mesh import default_mesh_config, make_meshes
from composer_jax.parallel.rules import default_rules, param_shardings
from composer_jax.train import step as step_lib
from composer_jax.train.state import init_state
from experiments.configs import layouts

_T, _D, _E, _F, _K = 64, 8, 16, 6, 2


def _inputs(seed=0, num_experts=_E):
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.standard_normal(s, dtype=np.float32))
  x = f(_T, _D)
  gate, up, down = (
    f(num_experts, _D, _F) / 3,
    f(num_experts, _D, _F) / 3,
    f(num_experts, _F, _D) / 3,
  )
  experts = jnp.asarray(
    np.argsort(rng.standard_normal((_T, num_experts)), axis=-1)[:, :_K], jnp.int32
  )  # K distinct experts per token
  weights = jnp.abs(f(_T, _K))
  valid = jnp.ones(_T, bool)
  return x, weights, experts, valid, gate, up, down


def _expert_mesh(ep):
  return make_meshes(default_mesh_config(expert_replica=8 // ep, expert=ep)).expert


@functools.cache
def _jitted_grad(fn):
  """jit of `(args) -> (grads of <y, c> w.r.t. x, gate values, expert weights), (y, dropped)`;
  one compile per dispatch function (tests reuse it)."""

  def loss(x, weights, experts, valid, gate, up, down):
    y, dropped = fn(x, weights, experts, valid, gate, up, down)
    return jnp.sum(y * jax.random.normal(jax.random.key(1), x.shape)), (y, dropped)

  return jax.jit(jax.grad(loss, argnums=(0, 1, 4, 5, 6), has_aux=True))


def _value_and_grads(fn, *args):
  """(y, dropped, grads) of dispatch `fn` at `args = (x, weights, experts, valid, gate, up,
  down)`."""
  grads, (y, dropped) = _jitted_grad(fn)(*args)
  return y, dropped, grads


@functools.cache
def _ep(ep, capacity_factor=None, ragged=False):
  return functools.partial(
    expert_parallel.dispatch,
    expert_fn=moe.grouped_swiglu,
    mesh=_expert_mesh(ep),
    rules=default_rules().expert,
    capacity_factor=capacity_factor,
    ragged=ragged,
  )


@pytest.mark.parametrize("ep,routing", [(8, "random"), (4, "random"), (8, "one_expert")])
def test_matches_dropless_values_and_grads(ep, routing):
  args = _inputs()
  if routing == "one_expert":  # every assignment to experts 0 and 1: all to shard 0
    args = args[:2] + (jnp.tile(jnp.array([[0, 1]], jnp.int32), (_T, 1)),) + args[3:]
  y, dropped, grads = _value_and_grads(_ep(ep), *args)
  want_y, _, want_grads = _value_and_grads(moe.dropless, *args)
  assert float(dropped) == 0.0
  chex.assert_trees_all_close(y, want_y, atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(grads, want_grads, atol=1e-5, rtol=1e-5)


def _hand_keep(experts, valid, ep, cap, ragged):
  """Kept assignments `[T, K]` by python loops over shards, in the documented priority."""
  experts, valid = np.asarray(experts), np.asarray(valid)
  local, shards = _E // ep, 8
  per = _T // shards
  keep = np.zeros(experts.shape, bool)
  received = {}  # (replica, receiving shard) -> rows so far (ragged: senders in shard order)
  for s in range(shards):
    replica = s // ep
    sent = {}
    rows = [(experts[t, k], t, k) for t in range(s * per, (s + 1) * per) for k in range(_K)]
    for e, t, k in sorted(rows):
      dest = e // local
      if ragged:
        n = received.get((replica, dest), 0)
        keep[t, k] = n < ep * cap
        received[(replica, dest)] = n + 1
      else:
        keep[t, k] = sent.get(dest, 0) < cap
        sent[dest] = sent.get(dest, 0) + 1
  return keep, int(np.sum(~keep & valid[:, None]))


def _fake_ragged_all_to_all(
  operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name
):
  """`jax.lax.ragged_all_to_all` as its docstring defines it, from all_gather (runs on CPU).

  A `recv_sizes` that disagrees with what the peer sends poisons the result with NaN.
  """
  n = output.shape[0]
  me = jax.lax.axis_index(axis_name)
  gather = lambda a: jax.lax.all_gather(a, axis_name)
  ops, in_off, sizes, out_off = map(gather, (operand, input_offsets, send_sizes, output_offsets))
  result = output
  for i in range(ops.shape[0]):
    r = jnp.arange(ops.shape[1])
    rows = ops[i][jnp.clip(in_off[i, me] + r, 0, ops.shape[1] - 1)]
    result = result.at[jnp.where(r < sizes[i, me], out_off[i, me] + r, n)].set(rows, mode="drop")
  bad = jnp.any(recv_sizes != sizes[:, me])
  if jnp.issubdtype(result.dtype, jnp.floating):
    result = jnp.where(bad, jnp.nan, result)
  return result


@pytest.mark.parametrize("ragged", [False, True])
def test_small_buffer_drops_counted_and_zero(ragged, monkeypatch):
  ep, factor = 4, 0.5
  x, weights, experts, valid, gate, up, down = _inputs(seed=2)
  experts = experts.at[: _T // 2, 0].set(0)  # overload shard 0 in the first half of the shards
  valid = valid.at[::5].set(False)  # padding is dropped silently, never counted
  if ragged:
    monkeypatch.setattr(jax.lax, "ragged_all_to_all", _fake_ragged_all_to_all)
  cap = expert_parallel.buffer_capacity(_T // 8, _K, _E, ep, factor)
  keep, hand_dropped = _hand_keep(experts, valid, ep, cap, ragged)
  assert hand_dropped > 0
  args = (x, weights, experts, valid, gate, up, down)
  y, dropped, grads = _value_and_grads(_ep(ep, capacity_factor=factor, ragged=ragged), *args)
  kept_weights = weights * jnp.asarray(keep)  # dropped assignments contribute 0
  want_y, _, want_grads = _value_and_grads(moe.dropless, x, kept_weights, *args[2:])
  assert float(dropped) == hand_dropped
  chex.assert_trees_all_close(y, want_y, atol=1e-5, rtol=1e-5)
  # The gate-value gradient of a dropped assignment is 0 here and <y_e(x), c> in dropless.
  want_grads = want_grads[:1] + (want_grads[1] * keep,) + want_grads[2:]
  chex.assert_trees_all_close(grads, want_grads, atol=1e-5, rtol=1e-5)


def test_ragged_path_matches_dropless(monkeypatch):
  monkeypatch.setattr(jax.lax, "ragged_all_to_all", _fake_ragged_all_to_all)
  args = _inputs(seed=3)
  y, dropped, grads = _value_and_grads(_ep(4, ragged=True), *args)
  want_y, _, want_grads = _value_and_grads(moe.dropless, *args)
  assert float(dropped) == 0.0
  chex.assert_trees_all_close((y, grads), (want_y, want_grads), atol=1e-5, rtol=1e-5)


def test_bad_inputs_clear_errors():
  args = _inputs(num_experts=12)
  with pytest.raises(
    ValueError, match="n_routed_experts=12 is not divisible by expert parallelism 8"
  ):
    _ep(8)(*args)
  dense_view = make_meshes(default_mesh_config()).dense
  with pytest.raises(ValueError, match="names mesh axis 'expert_replica', not in this view's"):
    expert_parallel.dispatch(
      *args, expert_fn=moe.grouped_swiglu, mesh=dense_view, rules=default_rules().expert
    )
  # Rules that split the experts' matrices (the `fsdp` layout) cannot run this dispatch.
  fsdp = layouts.get_config("fsdp")
  with pytest.raises(ValueError, match="shard 'experts' over one mesh axis and leave 'embed'"):
    expert_parallel.dispatch(
      *_inputs(),
      expert_fn=moe.grouped_swiglu,
      mesh=make_meshes(fsdp.mesh).expert,
      rules=fsdp.rules.expert,
    )


def test_moe_layer_with_sharded_params_matches_dropless():
  """The MoE layer selected by config, params on both mesh views (fsdp_ep), 21 tokens."""
  cfg = get_preset("tiny", moe_dispatch="expert_parallel")
  dm = make_meshes(default_mesh_config())
  x = jax.random.normal(jax.random.key(1), (3, 7, cfg.hidden_size))
  valid = jnp.ones((3, 7), bool)
  layer = moe.MoE(cfg)
  variables = layer.init(jax.random.key(0), x, valid)  # init needs no mesh
  axes = nn.get_partition_spec(variables)["params"]
  params = jax.device_put(
    nn.meta.unbox(variables["params"]),
    param_shardings(jax.tree.map(tuple, axes), dm, default_rules()),
  )
  apply = lambda c, p: moe.MoE(c).apply({**nn.meta.unbox(variables), "params": p}, x, valid)
  y, stats = jax.jit(context_mesh.with_mesh(dm, default_rules(), functools.partial(apply, cfg)))(
    params
  )
  want_y, _ = apply(cfg.replace(moe_dispatch="dropless"), nn.meta.unbox(variables["params"]))
  assert float(stats["dropped_tokens"]) == 0.0
  chex.assert_trees_all_close(y, want_y, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_train_step_reports_dropped_assignments():
  """cp2_ep8 (context parallel 2 and EP 8 on the same 8 devices), a bounded buffer: the
  step's dropped count is the sum over micro-batches of the forward's, and its fraction of
  all routed assignments is reported."""
  cfg = get_preset(
    "tiny",
    moe_dispatch="expert_parallel",
    num_layers=1,
    first_k_dense_replace=0,
    ep_capacity_factor=0.25,
  )
  layout = layouts.get_config("cp2_ep8")
  dm = make_meshes(layout.mesh)
  state = init_state(cfg, optax.sgd(0.1), jax.random.key(0))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.vocab_size, (2, 4, 16), dtype=np.int32)  # [G, B, L]
  ones = np.ones(tokens.shape, np.int32)
  batch = {
    "tokens": tokens,
    "targets": tokens,
    "loss_mask": ones.astype(np.float32),
    "segment_ids": ones,
    "positions": np.cumsum(ones, -1) - 1,
  }
  batch = {k: context.zigzag(v, 2) for k, v in batch.items()}  # the context-parallel layout
  step = step_lib.make_train_step(
    cfg,
    optax.sgd(0.1),
    optax.constant_schedule(0.1),
    jax.tree.map(lambda _: "adamw", state.params),
    loss_chunk=64,
    z_loss=0.0,
    router_bias_rate=0.0,
  )
  _, metrics = jax.jit(context_mesh.with_mesh(dm, layout.rules, step))(state, batch)
  forward = jax.jit(
    context_mesh.with_mesh(
      dm,
      layout.rules,
      lambda t, p: transformer.forward(
        cfg, {"params": state.params, "router": state.router}, t, positions=p
      )[1],
    )
  )
  per_micro = [forward(t, p) for t, p in zip(batch["tokens"], batch["positions"])]
  want = sum(float(a["dropped_tokens"]) for a in per_micro)
  routed = sum(float(a["router_counts"].sum()) for a in per_micro)
  assert want > 0
  np.testing.assert_allclose(metrics["moe/dropped_tokens"], want)
  np.testing.assert_allclose(metrics["moe/dropped_fraction"], want / routed, rtol=1e-6)
