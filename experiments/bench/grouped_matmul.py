"""Times the routed experts' grouped SwiGLU alone, per implementation, forward + backward.

    python -m experiments.bench.grouped_matmul --presets=tiny,small [--impls=tiled,looped]

The timed function is the jitted value_and_grad of `<grouped_swiglu(h, g, W), c>` w.r.t.
the rows and the three expert weights (`model/moe.py` `GROUPED_MATMULS`: `tiled` copies
each tile's expert weights; `looped`, `model/expert_loop.py`, reads them once per expert;
`ragged_dot` is a masked dense matmul over all experts on CPU, E x the FLOPs). Sizes are
the `vs_hf` bench's: rows = batch x seq x top-k of the preset (`tiny` 16 x 128 x 2 over 8
experts of 64 x 32; `small` 2 x 128 x 4 over 32 experts of 1024 x 512), sorted by expert,
group sizes drawn from a Dirichlet(2) over the experts (uneven, as routing is). The
implementations run in one process, interleaved (`timing.interleaved`), median of
`--rounds`; `tiled@32` is `tiled` at the tile_rows default before `looped` came. Each is
first checked against `ragged_dot` (values and gradients). Prints
each one's milliseconds and its time / the first implementation's.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from composer_jax.model import config as model_config
from composer_jax.model import moe
from experiments.bench import timing

_PRESETS = flags.DEFINE_list("presets", ["tiny", "small"], "Model presets whose sizes to use.")
_IMPLS = flags.DEFINE_list(
  "impls",
  ["tiled@32", "tiled", "looped"],
  "GROUPED_MATMULS names to time, each optionally @ its tile_rows (default: the preset's).",
)
_ROUNDS = flags.DEFINE_integer("rounds", 9, "Timed rounds (one call of each per round).")
# Rows per step of experiments.bench.vs_hf (batch x seq).
_TOKENS = {"tiny": 16 * 128, "small": 2 * 128}


def _inputs(cfg: model_config.ModelConfig, num_rows: int):
  """(rows, group sizes, gate, up, down, output cotangent), float32."""
  rng = np.random.default_rng(0)
  e, d, f = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
  counts = np.bincount(rng.choice(e, num_rows, p=rng.dirichlet(np.full(e, 2.0))), minlength=e)
  return (
    normal(num_rows, d),
    jnp.asarray(counts, jnp.int32),
    normal(e, d, f) / d**0.5,
    normal(e, d, f) / d**0.5,
    normal(e, f, d) / f**0.5,
    normal(num_rows, d),
  )


def _value_and_grads(impl: str, tile_rows: int, group_sizes, cot):
  def loss(h, gate, up, down):
    y = moe.grouped_swiglu(h, group_sizes, gate, up, down, impl=impl, tile_rows=tile_rows)
    return jnp.sum(y * cot)

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


def main(argv):
  del argv
  print(f"device: {jax.devices()[0].device_kind}")
  for preset in _PRESETS.value:
    cfg = model_config.get_preset(preset, dtype="float32")
    num_rows = _TOKENS[preset] * cfg.num_experts_per_tok
    h, group_sizes, gate, up, down, cot = _inputs(cfg, num_rows)
    args = (h, gate, up, down)
    fns = {}
    for spec in _IMPLS.value:
      impl, _, rows = spec.partition("@")
      fns[spec] = _value_and_grads(impl, int(rows or cfg.moe_tile_rows), group_sizes, cot)
    want = _value_and_grads("ragged_dot", cfg.moe_tile_rows, group_sizes, cot)(*args)
    for impl, fn in fns.items():
      err = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), fn(*args), want)
      print(
        f"{preset} {impl}: max |value and grads - ragged_dot's| {max(jax.tree.leaves(err)):.1e}"
      )
    calls = {impl: functools.partial(fn, *args) for impl, fn in fns.items()}
    times = timing.interleaved(calls, _ROUNDS.value, jax.block_until_ready)
    first = next(iter(times.values()))
    for impl, seconds in times.items():
      print(
        f"{preset} (rows={num_rows}, experts={cfg.n_routed_experts}, D={cfg.hidden_size}, "
        f"F={cfg.moe_intermediate_size}) {impl:10s}: {1e3 * seconds:8.2f} ms fwd+bwd, "
        f"/ {_IMPLS.value[0]} {seconds / first:.2f}"
      )


if __name__ == "__main__":
  app.run(main)
