"""Times a jitted forward+backward step per MoE dispatch, and its growth with E.

    python -m experiments.bench.moe_dispatch --presets=tiny,small

The timed function is `jax.value_and_grad` of the training loss (forward, chunked
cross-entropy through the output head, plus the balance loss) w.r.t. all params, at
random tokens, on one device; every dispatch of a preset runs in the same process:
dense one-hot, dropless with `ragged_dot`, `tiled` (`model/moe.py`) or `looped`
(`model/expert_loop.py`). Prints
compile seconds, median step milliseconds and each one's time / dense.

Then, for `tiny`, the step time of the default dropless dispatch (`moe_grouped_matmul=
'auto'`) vs the number of routed experts E (`--experts`) at fixed active FLOPs (same top-k
and expert width), and `step_time_max_over_min_vs_E=X` (flat: close to 1).

With more than one device visible it also times the routed experts alone (value_and_grad
of `<y, c>` w.r.t. tokens, gate values and expert weights, the preset's sizes, random
routing): expert-parallel dispatch (`composer_jax.parallel.expert_parallel`, EP = all
devices, default no-drop buffers) against single-device `dropless`, and prints
`ep / dropless` step time. On CPU get 8 fake devices with
`XLA_FLAGS=--xla_force_host_platform_device_count=8`; there EP only adds all-to-all copies
and 8x-padded no-drop buffers on the same cores, so expect a ratio above 1.

Sizes: `tiny` at batch 8 x seq 64 (preset as is). `small` at batch 1 x seq 64 with
`--small_layers=2` (one dense + one MoE layer) so a CPU step takes seconds; on an
accelerator pass `--small_layers=0 --small_batch=8 --small_seq=2048`. On CPU
`jax.lax.ragged_dot` lowers to a masked dense matmul over all experts (E x the active
FLOPs), which is why `auto` picks `looped` there.
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from jax.sharding import NamedSharding

from composer_jax.model import config as model_config
from composer_jax.model import loss as model_loss
from composer_jax.model import moe, transformer
from composer_jax.parallel import expert_parallel
from composer_jax.parallel.mesh import default_mesh_config
from composer_jax.parallel.rules import default_rules
from composer_jax.train import placement
from experiments.bench import timing

_PRESETS = flags.DEFINE_list("presets", ["tiny", "small"], "Model presets to time.")
_TINY_BATCH = flags.DEFINE_integer("tiny_batch", 8, "Batch size for tiny.")
_TINY_SEQ = flags.DEFINE_integer("tiny_seq", 64, "Sequence length for tiny.")
_SMALL_BATCH = flags.DEFINE_integer("small_batch", 1, "Batch size for non-tiny presets.")
_SMALL_SEQ = flags.DEFINE_integer("small_seq", 64, "Sequence length for non-tiny presets.")
_SMALL_LAYERS = flags.DEFINE_integer(
  "small_layers", 2, "num_layers for non-tiny presets (0 = the preset's)."
)
_ITERS = flags.DEFINE_integer("iters", 9, "Timed steps per dispatch (after one warm-up).")
_EXPERTS = flags.DEFINE_list(
  "experts", ["8", "16", "32", "64"], "Routed-expert counts of the tiny E sweep (empty: skip it)."
)

# name -> ModelConfig overrides of each timed dispatch.
_DISPATCHES = {
  "dense": dict(moe_dispatch="dense"),
  "ragged_dot": dict(moe_dispatch="dropless", moe_grouped_matmul="ragged_dot"),
  "tiled": dict(moe_dispatch="dropless", moe_grouped_matmul="tiled"),
  "looped": dict(moe_dispatch="dropless", moe_grouped_matmul="looped"),
}


def _step_call(cfg: model_config.ModelConfig, batch: int, seq: int):
  """A no-argument call of the jitted value_and_grad of the loss at random tokens."""
  variables = transformer.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, cfg.vocab_size)
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  mask = jnp.ones(inputs.shape, jnp.float32)

  def loss(params):
    hidden, aux = transformer.forward(
      cfg, {"params": params, "router": variables["router"]}, inputs
    )
    ce, _ = model_loss.chunked_cross_entropy(
      hidden, transformer.output_head(cfg, params), targets, mask, chunk_size=1024
    )
    return ce + aux["balance_loss"]

  step = jax.jit(jax.value_and_grad(loss))
  return lambda: step(variables["params"])


def _time_step(
  cfg: model_config.ModelConfig, batch: int, seq: int, iters: int
) -> tuple[float, float]:
  """(compile + first-call seconds, median step seconds) of value_and_grad of the loss."""
  call = _step_call(cfg, batch, seq)
  return _time(lambda: call(), (), iters)


def _time(step, args, iters: int) -> tuple[float, float]:
  """(compile + first-call seconds, median seconds of `iters` more calls) of `step(*args)`."""
  t0 = time.perf_counter()
  jax.block_until_ready(step(*args))
  first = time.perf_counter() - t0
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(step(*args))
    times.append(time.perf_counter() - t0)
  return first, float(np.median(times))


def _time_experts(
  cfg: model_config.ModelConfig, num_tokens: int, iters: int
) -> dict[str, tuple[float, float]]:
  """{'dropless', 'ep'}: (first, median step seconds) of the routed experts' value_and_grad."""
  e, d, f, k = (
    cfg.n_routed_experts,
    cfg.hidden_size,
    cfg.moe_intermediate_size,
    cfg.num_experts_per_tok,
  )
  keys = jax.random.split(jax.random.key(0), 6)
  x = jax.random.normal(keys[0], (num_tokens, d), cfg.dtype)
  gate, up = (jax.random.normal(kk, (e, d, f), cfg.dtype) / d**0.5 for kk in keys[1:3])
  down = jax.random.normal(keys[3], (e, f, d), cfg.dtype) / f**0.5
  experts = jax.lax.top_k(jax.random.normal(keys[4], (num_tokens, e)), k)[1]
  weights = jax.random.uniform(keys[5], (num_tokens, k))
  valid = jnp.ones((num_tokens,), bool)
  mesh, rules = placement.build_mesh(default_mesh_config(), cfg).expert, default_rules().expert
  dispatches = {
    "dropless": moe.dropless,
    "ep": functools.partial(
      expert_parallel.dispatch, expert_fn=moe.grouped_swiglu, mesh=mesh, rules=rules
    ),
  }

  def grads(fn, x, weights, gate, up, down):
    def loss(*a):
      y, _ = fn(a[0], a[1], experts, valid, *a[2:])
      return jnp.sum(y.astype(jnp.float32) * x.astype(jnp.float32))

    return jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))(x, weights, gate, up, down)

  args = (x, weights, gate, up, down)
  sp = expert_parallel.specs(mesh, rules)  # the dispatch's own layout of its inputs
  sharded = jax.device_put(
    args,
    tuple(NamedSharding(mesh, s) for s in (sp.tokens, sp.rows, sp.gate_up, sp.gate_up, sp.down)),
  )
  return {
    name: _time(jax.jit(functools.partial(grads, fn)), sharded if name == "ep" else args, iters)
    for name, fn in dispatches.items()
  }


def _sweep_experts(cfg: model_config.ModelConfig, batch: int, seq: int) -> None:
  """Default dropless step time vs E at fixed top-k and expert width (fixed active FLOPs).

  The E values are timed interleaved (one step of each per round, median over rounds).
  """
  calls = {
    int(e): _step_call(cfg.replace(n_routed_experts=int(e)), batch, seq) for e in _EXPERTS.value
  }
  times = timing.interleaved(calls, _ITERS.value, jax.block_until_ready)
  for e, step in times.items():
    print(
      f"tiny E={e:3d} (top-{cfg.num_experts_per_tok}, dropless "
      f"{moe.resolve_grouped_matmul(cfg.moe_grouped_matmul)}): step {1e3 * step:8.1f} ms"
    )
  print(f"step_time_max_over_min_vs_E={max(times.values()) / min(times.values()):.2f}")


def main(argv):
  del argv
  print(f"device: {jax.devices()[0].device_kind}")
  for preset in _PRESETS.value:
    cfg = model_config.get_preset(preset)
    batch, seq = _TINY_BATCH.value, _TINY_SEQ.value
    if preset != "tiny":
      batch, seq = _SMALL_BATCH.value, _SMALL_SEQ.value
      if _SMALL_LAYERS.value:
        cfg = cfg.replace(
          num_layers=_SMALL_LAYERS.value,
          first_k_dense_replace=min(cfg.first_k_dense_replace, _SMALL_LAYERS.value - 1),
        )
    step_s = {}
    for name, overrides in _DISPATCHES.items():
      first, step_s[name] = _time_step(cfg.replace(**overrides), batch, seq, _ITERS.value)
      print(
        f"{preset} (layers={cfg.num_layers}, batch={batch}, seq={seq}, dtype={cfg.dtype}) "
        f"{name:10s}: compile+first {first:7.1f} s, step {1e3 * step_s[name]:9.1f} ms, "
        f"/ dense {step_s[name] / step_s['dense']:.2f}"
      )
    if preset == "tiny" and _EXPERTS.value:
      _sweep_experts(cfg, batch, seq)
    if jax.device_count() == 1:
      print(f"{preset}: expert-parallel timing skipped (one device; see the module docstring)")
      continue
    timed = _time_experts(cfg, batch * seq, _ITERS.value)
    for name, (first, step) in timed.items():
      print(
        f"{preset} routed experts (tokens={batch * seq}) {name:8s} on "
        f"{jax.device_count() if name == 'ep' else 1} device(s): compile+first "
        f"{first:7.1f} s, step {1e3 * step:9.1f} ms"
      )
    print(
      f"{preset}: ep / dropless routed-experts step time = "
      f"{timed['ep'][1] / timed['dropless'][1]:.2f}"
    )


if __name__ == "__main__":
  app.run(main)
