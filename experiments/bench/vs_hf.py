"""Train-step speed against transformers' `DeepseekV3ForCausalLM`, same machine, same dims.

    python -m experiments.bench.vs_hf --presets=tiny,small [--rounds=5] [--threads=1]

One training step = forward + backward + AdamW update at random tokens: ours is one jitted
function (`transformer.forward`, chunked cross-entropy through the output head,
`optax.adamw`); the peer is eager PyTorch (`model(input_ids, labels=...)`,
`loss.backward()`, `torch.optim.AdamW.step()`), built from `hf.config_map.to_hf` of the
same `ModelConfig` (attention: PyTorch SDPA; experts: `--hf_experts`, transformers'
default 'eager' loop over the experts hit). Each side runs in its own process
(`experiments.bench.versus`: health check first, interleaved rounds, medians, MFU against
the measured matmul peak); float32 on CPU, bfloat16 compute with float32 parameters on GPU
(`--device=gpu`: ours `dtype=bfloat16`, the peer under `torch.autocast`).

Sizes: `tiny` as is at `--tiny_batch` x `--tiny_seq`. `small` with `--small_layers` layers
(1 dense + the rest MoE; 0 = the preset's 12) at `--small_batch` x `--small_seq`, no remat.
Default 2 layers: at 4, the two float32 processes (params, AdamW state, gradients, XLA's
compile) need ~10 GB together and were OOM-killed twice on the shared 24 GB machine. At 12
(`--small_layers=0`) one process needs ~11 GB: `--passes=N` keeps one side's process alive
at a time (`versus.compare`), e.g. `--small_layers=0 --rounds=3 --passes=2`.
Last lines: `throughput_ratio_vs_hf_<preset>=X` (the peer's step time / ours: > 1 means
we are faster), or why no ratio is given.
"""

import numpy as np
from absl import app, flags

from experiments.bench import versus
from experiments.bench.hf_peer import hf_model, model_config

_PRESETS = flags.DEFINE_list("presets", ["tiny", "small"], "Model presets to compare.")
_TINY_BATCH = flags.DEFINE_integer("tiny_batch", 16, "Rows per step for tiny.")
_TINY_SEQ = flags.DEFINE_integer("tiny_seq", 128, "Tokens per row for tiny.")
_SMALL_BATCH = flags.DEFINE_integer("small_batch", 2, "Rows per step for small.")
_SMALL_SEQ = flags.DEFINE_integer("small_seq", 128, "Tokens per row for small.")
_SMALL_LAYERS = flags.DEFINE_integer("small_layers", 2, "small's num_layers (0 = preset's).")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds (one step of each side per round).")
_PASSES = flags.DEFINE_integer(
  "passes",
  0,
  "> 0: one side's process alive at a time (models too big for two in memory), each side "
  "`--rounds` steps per pass, this many passes (versus.compare).",
)
_THREADS = flags.DEFINE_integer("threads", 1, "Intra-op threads per side (versus.py says why 1).")
_DEVICE = flags.DEFINE_enum("device", "cpu", ["cpu", "gpu"], "Where both sides run.")
_HF_EXPERTS = flags.DEFINE_enum(
  "hf_experts",
  "eager",
  ["eager", "grouped_mm", "batched_mm"],
  "transformers' experts implementation.",
)
_LAYER_LOOP = flags.DEFINE_enum(
  "layer_loop",
  "preset",
  ["preset", "scan", "unroll"],
  "Ours: the preset's `scan_layers`, or a `scan` loop, or the stack unrolled.",
)
_LR = 1e-4


def _tokens(cfg, batch: int, seq: int) -> np.ndarray:
  return np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq + 1))


def ours_train(
  preset: str, layers: int, batch: int, seq: int, device: str, layer_loop: str = "preset"
):
  """A call running one jitted train step of ours and waiting for it (state kept);
  `layer_loop`: as `--layer_loop`."""
  import functools

  import jax
  import jax.numpy as jnp
  import optax

  from composer_jax.model import loss as model_loss
  from composer_jax.model import transformer

  cfg = model_config(preset, layers, device)
  if layer_loop != "preset":
    cfg = cfg.replace(scan_layers=layer_loop == "scan")
  tokens = _tokens(cfg, batch, seq)
  variables = transformer.init(cfg, jax.random.key(0))
  tx = optax.adamw(_LR)
  inputs, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
  mask = jnp.ones(inputs.shape, jnp.float32)

  def loss_fn(params):
    hidden, _ = transformer.forward(cfg, {"params": params, "router": variables["router"]}, inputs)
    ce, _ = model_loss.chunked_cross_entropy(
      hidden, transformer.output_head(cfg, params), targets, mask
    )
    return ce

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  state = [variables["params"], tx.init(variables["params"])]

  def call():
    state[0], state[1], loss = step(*state)
    jax.block_until_ready(loss)

  return call


def peer_train(preset: str, layers: int, batch: int, seq: int, device: str, experts: str):
  """A call running one eager train step of transformers' DeepSeek-V3 and waiting for it."""
  import contextlib

  import torch

  cfg = model_config(preset, layers, device)
  dev = "cuda" if device == "gpu" else "cpu"
  model = hf_model(cfg, device, experts).train()
  opt = torch.optim.AdamW(model.parameters(), lr=_LR)
  ids = torch.from_numpy(_tokens(cfg, batch, seq).astype(np.int64)).to(dev)
  autocast = (
    (lambda: torch.autocast("cuda", torch.bfloat16)) if dev == "cuda" else (contextlib.nullcontext)
  )

  def call():
    # transformers shifts labels itself: logits at i predict token i + 1 (as ours).
    with autocast():
      loss = model(input_ids=ids[:, :-1], labels=ids[:, :-1]).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()

  return call


def main(argv):
  del argv
  from composer_jax.model import flops

  for preset in _PRESETS.value:
    if preset == "tiny":
      layers, batch, seq = 0, _TINY_BATCH.value, _TINY_SEQ.value
    else:
      layers, batch, seq = _SMALL_LAYERS.value, _SMALL_BATCH.value, _SMALL_SEQ.value
    cfg = model_config(preset, layers, _DEVICE.value)
    args = dict(preset=preset, layers=layers, batch=batch, seq=seq, device=_DEVICE.value)
    sides = [
      versus.Side(
        "ours",
        "jax",
        "experiments.bench.vs_hf:ours_train",
        dict(args, layer_loop=_LAYER_LOOP.value),
      ),
      versus.Side(
        "transformers",
        "torch",
        "experiments.bench.vs_hf:peer_train",
        dict(args, experts=_HF_EXPERTS.value),
      ),
    ]
    result = versus.compare(
      sides,
      rounds=_ROUNDS.value,
      threads=_THREADS.value,
      device=_DEVICE.value,
      flops_per_call=batch * seq * flops.train_flops_per_token(cfg, seq),
      items_per_call=batch * seq,
      passes=_PASSES.value,
    )
    print(
      f"{preset} (layers={cfg.num_layers}, experts={cfg.n_routed_experts}, batch={batch}, "
      f"seq={seq}, {cfg.dtype}, fwd+bwd+AdamW, hf experts={_HF_EXPERTS.value}, "
      f"our layer loop={_LAYER_LOOP.value}):"
    )
    versus.report(result, f"throughput_ratio_vs_hf_{preset}")


if __name__ == "__main__":
  app.run(main)
