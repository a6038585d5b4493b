"""Sharded Muon vs optax.contrib.muon: one optimizer step on the same sharded parameters.

    python -m experiments.bench.muon [--presets=tiny,wide] [--layout=fsdp_ep] [--iters=5]

Runs on 8 fake CPU devices (XLA_FLAGS set below, before jax is imported). For
each preset, both optimizers are full Muon + AdamW optimizers with the same
hyperparameters (`optax.contrib.muon` with the MuonDimensionNumbers of our
logical-axis table, vs `sharded_scale_by_muon` + AdamW in the same `partition`),
jitted with the parameters' layout shardings. Prints per preset the step times,
their ratio, and the achieved Newton–Schulz FLOP/s (useful FLOPs of
`composer_jax.optim.muon_cost`, all 8 devices together, over our step time) as
a fraction of the measured matmul FLOP/s of one device and of all 8 devices
running matmuls at once. The 8 fake devices share this machine's cores, so one
fake device's matmul rate is not a ceiling for all 8 together: the second fraction
is the meaningful one on CPU. Last line: `speedup_vs_optax=X` for the last preset.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from composer_jax.model import axes as axes_lib  # noqa: E402
from composer_jax.model import transformer  # noqa: E402
from composer_jax.model.config import get_preset  # noqa: E402
from composer_jax.optim import muon, muon_cost  # noqa: E402
from composer_jax.optim.sharded_muon import sharded_scale_by_muon  # noqa: E402
from composer_jax.parallel.mesh import make_meshes  # noqa: E402
from composer_jax.parallel.rules import param_shardings  # noqa: E402
from experiments.configs import layouts  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("presets", ["tiny", "wide"], "Model presets ('wide' = tiny at 4x width).")
flags.DEFINE_string("layout", "fsdp_ep", "Layout name in experiments.configs.layouts.")
flags.DEFINE_integer("iters", 5, "Timed steps per optimizer (after one warm-up).")

# tiny with every matrix 4x wider and twice the experts: NS dominates the step.
_WIDE = dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
             q_lora_rank=128, kv_lora_rank=128, n_routed_experts=16, n_group=4, topk_group=2,
             num_layers=4)
_LR = 0.02


def _timed(fn, *args, iters):
  """Best wall seconds of fn(*args) over `iters` calls after a warm-up (robust to load)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iters):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return min(times)


def matmul_flops_per_s(devices, iters: int) -> float:
  """Measured float32 matmul FLOP/s of `devices` together (32 x [256, 512] @ [512, 512] each)."""
  n = len(devices)
  sharding = NamedSharding(Mesh(np.asarray(devices), ("d",)), PartitionSpec("d"))
  x = jax.device_put(jnp.ones((32 * n, 256, 512), jnp.float32), sharding)
  w = jax.device_put(jnp.ones((32 * n, 512, 512), jnp.float32), sharding)
  seconds = _timed(jax.jit(lambda a, b: a @ b), x, w, iters=iters)
  return 2 * 32 * n * 256 * 512 * 512 / seconds


def bench_preset(cfg, layout_cfg, iters):
  names = transformer.logical_axes(cfg)["params"]
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))["params"]
  shardings = param_shardings(names, make_meshes(layout_cfg.mesh), layout_cfg.rules,
                              shapes=shapes)
  is_muon = jax.tree.map(axes_lib.uses_muon, names, is_leaf=muon.is_axes_leaf)
  labels = jax.tree.map(lambda m: "muon" if m else "adam", is_muon)
  dims = jax.tree.map(lambda n: optax.contrib.MuonDimensionNumbers(*axes_lib.muon_dims(n)[1])
                      if axes_lib.uses_muon(n) else None, names, is_leaf=muon.is_axes_leaf)
  theirs = optax.contrib.muon(_LR, muon_weight_dimension_numbers=dims, consistent_rms=0.2,
                              adam_learning_rate=_LR)
  ours = optax.partition({
      "muon": optax.chain(sharded_scale_by_muon(names, shardings),
                          optax.scale_by_learning_rate(_LR)),
      "adam": optax.adamw(_LR, eps=1e-8)}, labels)

  params = jax.jit(lambda: transformer.init(cfg, jax.random.key(0))["params"],
                   out_shardings=shardings)()
  grads = jax.jit(lambda p: jax.tree.map(lambda x: jnp.sin(1e3 * x), p),
                  out_shardings=shardings)(params)
  seconds = {}
  for name, opt in (("ours", ours), ("optax", theirs)):
    state = jax.jit(opt.init)(params)
    step = jax.jit(opt.update)
    seconds[name] = _timed(step, grads, state, params, iters=iters)
  mats = muon_cost.muon_matrices(names, shapes)
  flops = sum(m.count * muon_cost.ns_flops(m.fan_in, m.fan_out) for m in mats)
  return seconds, flops


def main(argv):
  del argv
  layout_cfg = layouts.get_config(FLAGS.layout)
  one = matmul_flops_per_s(jax.devices()[:1], FLAGS.iters)
  every = matmul_flops_per_s(jax.devices(), FLAGS.iters)
  print(f"devices={jax.device_count()} ({jax.devices()[0].platform}) layout={FLAGS.layout}; "
        f"f32 matmul: one device {one / 1e9:.1f} GFLOP/s, all {jax.device_count()} devices "
        f"at once {every / 1e9:.1f} GFLOP/s")
  ratio = None
  for preset in FLAGS.presets:
    cfg = get_preset("tiny", **_WIDE) if preset == "wide" else get_preset(preset)
    seconds, flops = bench_preset(cfg, layout_cfg, FLAGS.iters)
    ratio = seconds["optax"] / seconds["ours"]
    achieved = flops / seconds["ours"]
    print(f"{preset}: sharded muon {seconds['ours'] * 1e3:.1f} ms, optax.contrib.muon "
          f"{seconds['optax'] * 1e3:.1f} ms, ratio {ratio:.2f}x; NS {flops / 1e9:.2f} GFLOP -> "
          f"{achieved / 1e9:.1f} GFLOP/s = {achieved / one:.2f} of one device's matmul, "
          f"{achieved / every:.2f} of all devices' matmul")
  print(f"speedup_vs_optax={ratio:.2f}")


if __name__ == "__main__":
  app.run(main)
