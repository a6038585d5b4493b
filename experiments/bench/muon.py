"""Sharded Muon vs optax.contrib.muon: one optimizer step on the same sharded parameters.

    python -m experiments.bench.muon [--presets=tiny,wide] [--layout=fsdp_ep] [--iters=5]

Runs on 8 fake CPU devices (XLA_FLAGS set below, before jax is imported). For
each preset, both optimizers are full Muon + AdamW optimizers with the same
hyperparameters (`optax.contrib.muon` with the MuonDimensionNumbers of our
logical-axis table, vs `sharded_scale_by_muon` + AdamW in the same `partition`),
jitted with the parameters' layout shardings. Prints per preset:

* the median step time of each side over `--iters` interleaved rounds, and their ratio;
* the FLOPs each side's compiled program does (XLA's `cost_analysis`, per device x 8;
  it counts a loop body once, so both sides count one of their 5 NS iterations: compare
  the two with each other) next to the useful Newton–Schulz FLOPs of all 5 iterations
  (`composer_jax.optim.muon_cost`). On one
  machine's fake devices the ratio is not a network figure: it is mostly the redundant
  work GSPMD gives optax's per-leaf Newton–Schulz (each device repeats matmuls on
  replicated matrices), which sharded Muon avoids by orthogonalizing whole matrices once;
* the achieved useful NS FLOP/s against a measured yardstick: the FLOP/s of one
  2048 x 2048 float32 matmul on one device, and of all 8 devices running such matmuls
  at once (the 8 fake devices share this machine's cores, so the second is the ceiling).

Then Newton–Schulz at `precision` 'mixed' / 'bfloat16' (`optim.newton_schulz`) vs float32
on the preset's largest matrix shape: relative Frobenius error, and time.
Last line: `speedup_vs_optax=X` for the last preset (a step-time ratio on this machine).
"""

import os

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from composer_jax.model import axes as axes_lib  # noqa: E402
from composer_jax.model import transformer  # noqa: E402
from composer_jax.model.config import get_preset  # noqa: E402
from composer_jax.optim import muon, muon_cost, newton_schulz  # noqa: E402
from composer_jax.optim.sharded_muon import sharded_scale_by_muon  # noqa: E402
from composer_jax.parallel.rules import param_shardings  # noqa: E402
from composer_jax.train import placement  # noqa: E402
from experiments.bench import muon_presets, timing  # noqa: E402
from experiments.configs import layouts  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("presets", ["tiny", "wide"], "Model presets ('wide' = tiny at 4x width).")
flags.DEFINE_string("layout", "fsdp_ep", "Layout name in experiments.configs.layouts.")
flags.DEFINE_integer("iters", 7, "Timed rounds (one step per optimizer per round).")


def _median(fn, *args, iters):
  """Median wall seconds of fn(*args) over `iters` calls after a warm-up."""
  return timing.interleaved({"f": lambda: fn(*args)}, iters, jax.block_until_ready)["f"]


def matmul_flops_per_s(devices, iters: int, n: int = 2048) -> float:
  """Measured float32 FLOP/s of one [n, n] @ [n, n] matmul on each of `devices`, together."""
  k = len(devices)
  sharding = NamedSharding(Mesh(np.asarray(devices), ("d",)), PartitionSpec("d"))
  x = jax.device_put(jnp.ones((k, n, n), jnp.float32), sharding)
  return 2 * k * n**3 / _median(jax.jit(lambda a: a @ a), x, iters=iters)


def _program_flops(fn, *args) -> float:
  """FLOPs of the compiled (per-device SPMD) program, times the device count."""
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return float(cost.get("flops", 0.0)) * jax.device_count()


def ns_precision_errors(shape, iters):
  """{precision: (relative Frobenius error vs float32, median seconds)} on `shape`."""
  x = jax.random.normal(jax.random.key(0), shape, jnp.float32)
  out, seconds = {}, {}
  for p in newton_schulz.PRECISIONS:
    fn = jax.jit(lambda a, p=p: newton_schulz.orthogonalize(a, precision=p))
    out[p] = fn(x)
    seconds[p] = _median(fn, x, iters=iters)
  err = lambda y: float(jnp.linalg.norm(y - out["float32"]) / jnp.linalg.norm(out["float32"]))
  return {p: (err(y), seconds[p]) for p, y in out.items()}


def bench_preset(cfg, layout_cfg, iters):
  names = transformer.logical_axes(cfg)["params"]
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))["params"]
  shardings = param_shardings(
    names, placement.build_mesh(layout_cfg.mesh, cfg), layout_cfg.rules, shapes=shapes
  )
  is_muon = jax.tree.map(axes_lib.uses_muon, names, is_leaf=muon.is_axes_leaf)
  labels = jax.tree.map(lambda m: "muon" if m else "adam", is_muon)
  dims = jax.tree.map(
    lambda n: (
      optax.contrib.MuonDimensionNumbers(*axes_lib.muon_dims(n)[1])
      if axes_lib.uses_muon(n)
      else None
    ),
    names,
    is_leaf=muon.is_axes_leaf,
  )
  theirs = optax.contrib.muon(
    muon_presets.LR,
    muon_weight_dimension_numbers=dims,
    consistent_rms=0.2,
    adam_learning_rate=muon_presets.LR,
  )
  ours = optax.partition(
    {
      "muon": optax.chain(
        sharded_scale_by_muon(names, shardings), optax.scale_by_learning_rate(muon_presets.LR)
      ),
      "adam": optax.adamw(muon_presets.LR, eps=1e-8),
    },
    labels,
  )

  params = jax.jit(
    lambda: transformer.init(cfg, jax.random.key(0))["params"], out_shardings=shardings
  )()
  grads = jax.jit(lambda p: jax.tree.map(lambda x: jnp.sin(1e3 * x), p), out_shardings=shardings)(
    params
  )
  calls, program_flops = {}, {}
  for name, opt in (("ours", ours), ("optax", theirs)):
    state = jax.jit(opt.init)(params)
    step = jax.jit(opt.update)
    calls[name] = lambda step=step, state=state: step(grads, state, params)
    program_flops[name] = _program_flops(opt.update, grads, state, params)
  seconds = timing.interleaved(calls, iters, jax.block_until_ready)
  mats = muon_cost.muon_matrices(names, shapes)
  flops = sum(m.count * muon_cost.ns_flops(m.fan_in, m.fan_out) for m in mats)
  largest = max(mats, key=lambda m: m.fan_in * m.fan_out)
  return seconds, flops, program_flops, (largest.fan_in, largest.fan_out)


def main(argv):
  del argv
  layout_cfg = layouts.get_config(FLAGS.layout)
  one = matmul_flops_per_s(jax.devices()[:1], FLAGS.iters)
  every = matmul_flops_per_s(jax.devices(), FLAGS.iters)
  print(
    f"devices={jax.device_count()} ({jax.devices()[0].platform}) layout={FLAGS.layout}; "
    f"yardstick 2048^2 f32 matmul (median of {FLAGS.iters}): one device "
    f"{one / 1e9:.1f} GFLOP/s, all {jax.device_count()} devices at once "
    f"{every / 1e9:.1f} GFLOP/s"
  )
  ratio = None
  for preset in FLAGS.presets:
    cfg = muon_presets.wide() if preset == "wide" else get_preset(preset)
    seconds, flops, program_flops, shape = bench_preset(cfg, layout_cfg, FLAGS.iters)
    ratio = seconds["optax"] / seconds["ours"]
    achieved = flops / seconds["ours"]
    print(
      f"{preset}: median of {FLAGS.iters} interleaved steps: sharded muon "
      f"{seconds['ours'] * 1e3:.1f} ms, optax.contrib.muon {seconds['optax'] * 1e3:.1f} "
      f"ms, ratio {ratio:.2f}x"
    )
    print(
      f"{preset}: useful NS {flops / 1e9:.2f} GFLOP; compiled programs (all devices, "
      f"loop bodies counted once): "
      f"ours {program_flops['ours'] / 1e9:.2f} GFLOP, optax "
      f"{program_flops['optax'] / 1e9:.2f} GFLOP (x{program_flops['optax'] / max(program_flops['ours'], 1):.1f}"
      f" ours: GSPMD's redundant work on optax's side, not a network effect)"
    )
    print(
      f"{preset}: useful NS FLOP/s {achieved / 1e9:.1f} GFLOP/s = {achieved / one:.2f} of "
      f"one device's 2048^2 matmul, {achieved / every:.2f} of all devices' together"
    )
    for p, (err, sec) in ns_precision_errors((8, *shape), FLAGS.iters).items():
      print(
        f"{preset}: NS precision {p:8s} on [8, {shape[0]}, {shape[1]}]: rel. error vs "
        f"float32 {err:.4f}, {sec * 1e3:.1f} ms"
      )
  print(f"speedup_vs_optax={ratio:.2f}")


if __name__ == "__main__":
  app.run(main)
