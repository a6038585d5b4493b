"""Times one jitted optimizer update, Muon vs AdamW, on a model preset's parameter shapes.

    python -m experiments.bench.optimizer_step --presets=tiny,small --small_layers=2

Parameters come from `jax.eval_shape` of the model (`transformer.init`), gradients
are standard normal; the timed call is `tx.update(grads, state, params)` of
`composer_jax.optim.build_optimizer` with the base config's `optim` fields
(name 'muon' vs 'adamw'), on one device. Prints median milliseconds and the
Muon/AdamW ratio. On a CPU the full `small` preset (~0.6B parameters, 12 layers)
takes minutes per Muon step, so `--small_layers` (default 2: one dense and one
MoE layer) shrinks its depth; 0 keeps the preset's.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from composer_jax.model import config as model_config
from composer_jax.model import transformer
from composer_jax.optim import build_optimizer
from composer_jax.train import config as train_config
from experiments.configs import base

_PRESETS = flags.DEFINE_list("presets", ["tiny", "small"], "Model presets to time.")
_SMALL_LAYERS = flags.DEFINE_integer(
  "small_layers", 2, "num_layers for non-tiny presets (0 = the preset's)."
)
_ITERS = flags.DEFINE_integer("iters", 5, "Timed calls per optimizer (after one warm-up).")


def _time_update(tx, params, grads, iters: int) -> float:
  """Median seconds of a jitted tx.update (compile and first call excluded)."""
  update = jax.jit(tx.update)
  state = jax.jit(tx.init)(params)
  jax.block_until_ready(update(grads, state, params))
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(update(grads, state, params))
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def main(argv):
  del argv
  optim_cfg = train_config.optim_config(base.get_base_config())  # total_steps resolved
  print(f"device: {jax.devices()[0].device_kind}")
  for preset in _PRESETS.value:
    cfg = model_config.get_preset(preset)
    if preset != "tiny" and _SMALL_LAYERS.value:
      cfg = cfg.replace(
        num_layers=_SMALL_LAYERS.value,
        first_k_dense_replace=min(cfg.first_k_dense_replace, _SMALL_LAYERS.value),
      )
    axes = transformer.logical_axes(cfg)["params"]
    shapes = jax.eval_shape(lambda c=cfg: transformer.init(c, jax.random.key(0)))["params"]
    leaves, treedef = jax.tree.flatten(shapes)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    grads = treedef.unflatten(
      [jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, leaves)]
    )
    params = jax.tree.map(jnp.zeros_like, grads)
    n = sum(x.size for x in leaves)
    ms = {}
    for name in ("muon", "adamw"):
      cfg_o = optim_cfg.copy_and_resolve_references()
      cfg_o.name = name
      ms[name] = 1e3 * _time_update(build_optimizer(cfg_o, axes), params, grads, _ITERS.value)
    print(
      f"{preset} (num_layers={cfg.num_layers}, {n / 1e6:.1f}M params): "
      f"muon {ms['muon']:.1f} ms, adamw {ms['adamw']:.1f} ms, "
      f"muon/adamw {ms['muon'] / ms['adamw']:.1f}x"
    )


if __name__ == "__main__":
  app.run(main)
