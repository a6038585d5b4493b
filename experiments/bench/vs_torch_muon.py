"""Muon step speed against `torch.optim.Muon`, same matrices, each side in its own process.

    python -m experiments.bench.vs_torch_muon [--presets=tiny,small,wide] [--small_layers=4]

Both sides update the Muon parameters of a preset (every parameter whose logical axes
give it two matrix axes; `composer_jax.model.axes.uses_muon`) from a fixed gradient:
momentum 0.95 with Nesterov, 5 Newton–Schulz steps of the quintic (3.4445, -4.775,
2.0315), float32 parameters and momentum; torch runs Newton–Schulz in bfloat16 (it casts
the momentum to bfloat16), so ours does too by default (`--ns_precision`), in the library's
default NS chunks (`--ns_batch_elements`: on CPU the large matrices one at a time, which
XLA:CPU multiplies natively in bfloat16); the update scaled to AdamW's RMS (ours
'consistent_rms', torch `adjust_lr_fn='match_rms_adamw'`: both 0.2 sqrt(max(fan_in,
fan_out))), no weight decay. MFU's yardstick is the float32 matmul. Ours is one jitted
`scale_by_muon` step over the model's own tree (same-shape matrices batched, per layer, per
expert, per head, in those chunks); the peer gets each independent matrix as its own 2-D
parameter, since `torch.optim.Muon` takes 2-D parameters only (it loops over
them). One side per process (`experiments.bench.versus`: health check, interleaved rounds,
medians on the CPU clock, MFU = Newton–Schulz FLOPs (`optim.muon_cost.ns_flops`) / step
time / measured matmul peak). `wide`: tiny at 4x width and 16 experts (NS dominates).
Last lines: `speedup_vs_torch_muon_<preset>=X` (peer time / ours).
"""

from absl import app, flags

from experiments.bench import muon_presets, versus

_PRESETS = flags.DEFINE_list(
  "presets", ["tiny", "small", "wide"], "Model presets (`wide`: see doc)."
)
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds (one step of each side per round).")
_THREADS = flags.DEFINE_integer("threads", 1, "Intra-op threads per side (versus.py says why 1).")
_SMALL_LAYERS = flags.DEFINE_integer(
  "small_layers",
  4,
  "small's num_layers (1 dense + the rest MoE; 0 = the preset's 12, whose memory RESULTS.md "
  "gives).",
)
_PASSES = flags.DEFINE_integer(
  "passes",
  0,
  "> 0: one side's process alive at a time (sizes whose two processes do not fit in memory "
  "together), each side `--rounds` steps per pass, this many passes (versus.compare).",
)
_NS_PRECISION = flags.DEFINE_enum(
  "ns_precision",
  "bfloat16",
  ["float32", "mixed", "bfloat16"],
  "Our Newton–Schulz precision (torch's is bfloat16).",
)
_NS_BATCH = flags.DEFINE_integer(
  "ns_batch_elements",
  -1,
  "Our Newton–Schulz chunk budget (`newton_schulz.orthogonalize`; -1 per backend, 0 all at once).",
)


def _matrices(preset: str, layers: int, shapes_only: bool = False):
  """(params tree, logical axes tree) of the preset's Muon parameters, float32, `layers` > 0
  cutting a non-`wide` stack (`hf_peer.model_config`); `shapes_only`:
  `jax.ShapeDtypeStruct`s, nothing allocated."""
  import jax

  from composer_jax.model import axes as axes_lib
  from composer_jax.model import transformer
  from experiments.bench.hf_peer import model_config as cut_config

  cfg = muon_presets.wide() if preset == "wide" else cut_config(preset, layers, "cpu")
  cfg = cfg.replace(param_dtype="float32")
  if shapes_only:
    params = transformer.shapes(cfg)["params"]
  else:
    params = transformer.init(cfg, jax.random.key(0))["params"]
  axes = transformer.logical_axes(cfg)["params"]
  flat_axes = dict(jax.tree_util.tree_leaves_with_path(axes, is_leaf=_is_names))
  flat = {
    jax.tree_util.keystr(p): (x, flat_axes[p])
    for p, x in jax.tree_util.tree_leaves_with_path(params)
    if axes_lib.uses_muon(flat_axes[p])
  }
  return {k: x for k, (x, _) in flat.items()}, {k: n for k, (_, n) in flat.items()}


def _is_names(x) -> bool:
  return isinstance(x, tuple) and all(isinstance(n, str) for n in x)


def ours_step(preset: str, layers: int, ns_precision: str, ns_batch_elements: int):
  """A call running one jitted Muon step of ours (state kept) and waiting for it."""
  import functools

  import jax
  import optax

  from composer_jax.optim import scale_by_muon

  params, axes = _matrices(preset, layers)
  grads = jax.tree.map(lambda x: jax.random.normal(jax.random.key(1), x.shape, x.dtype), params)
  tx = optax.chain(
    scale_by_muon(
      axes,
      scale_mode="consistent_rms",
      ns_precision=ns_precision,
      ns_batch_elements=ns_batch_elements,
    ),
    optax.scale(-muon_presets.LR),
  )

  # grads an argument, not a closed-over constant; params and state updated in place.
  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  state = [params, tx.init(params)]

  def call():
    state[0], state[1] = step(*state, grads)
    jax.block_until_ready(state[0])

  return call


def peer_step(preset: str, layers: int):
  """A call running one `torch.optim.Muon` step over the same matrices, one 2-D each."""
  import numpy as np
  import torch

  from composer_jax.model import axes as axes_lib

  params, axes = _matrices(preset, layers)
  mats = []
  for key, x in params.items():
    batch, (r, o) = axes_lib.muon_dims(axes[key])
    x = np.moveaxis(np.asarray(x), batch + (r, o), range(x.ndim))
    mats += list(x.reshape(-1, x.shape[-2], x.shape[-1]))
  torch.manual_seed(1)
  tensors = [torch.nn.Parameter(torch.from_numpy(m.copy())) for m in mats]
  for t in tensors:
    t.grad = torch.randn_like(t)
  opt = torch.optim.Muon(
    tensors,
    lr=muon_presets.LR,
    weight_decay=0.0,
    momentum=0.95,
    nesterov=True,
    adjust_lr_fn="match_rms_adamw",
  )
  return opt.step


def main(argv):
  del argv
  from composer_jax.optim import muon_cost

  for preset in _PRESETS.value:
    layers = 0 if preset in ("tiny", "wide") else _SMALL_LAYERS.value
    params, axes = _matrices(preset, layers, shapes_only=True)
    sets = muon_cost.muon_matrices(axes, params)
    sides = [
      versus.Side(
        "ours",
        "jax",
        "experiments.bench.vs_torch_muon:ours_step",
        {
          "preset": preset,
          "layers": layers,
          "ns_precision": _NS_PRECISION.value,
          "ns_batch_elements": _NS_BATCH.value,
        },
      ),
      versus.Side(
        "torch.optim.Muon",
        "torch",
        "experiments.bench.vs_torch_muon:peer_step",
        {"preset": preset, "layers": layers},
      ),
    ]
    result = versus.compare(
      sides,
      rounds=_ROUNDS.value,
      threads=_THREADS.value,
      item="matrices",
      flops_per_call=sum(m.count * muon_cost.ns_flops(m.fan_in, m.fan_out) for m in sets),
      items_per_call=sum(m.count for m in sets),
      passes=_PASSES.value,
    )
    print(
      f"{preset} ({len(params)} Muon parameters, {sum(m.count for m in sets)} matrices, "
      f"momentum + 5 NS steps; NS in {_NS_PRECISION.value} (ours), bfloat16 (torch)):"
    )
    versus.report(result, f"speedup_vs_torch_muon_{preset}")


if __name__ == "__main__":
  app.run(main)
