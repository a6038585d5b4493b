"""Train-step throughput against transformers' `DeepseekV3ForCausalLM`, same CPU, same dims.

    python -m experiments.bench.vs_hf --presets=tiny,small

One training step = forward + backward + AdamW update, float32, at random tokens:
ours is one jitted function (`transformer.forward`, chunked cross-entropy through the
output head, `optax.adamw`); the peer is eager PyTorch (`model(input_ids, labels=...)`,
`loss.backward()`, `torch.optim.AdamW.step()`), built from `hf.config_map.to_hf` of the same
`ModelConfig` (attention: PyTorch SDPA). Both run in this process, interleaved (one step
of each per round, median over `--rounds`), so load from other processes hits both alike.

Sizes: `tiny` as is at 16 x 128 tokens per step. `small` with `--small_layers` layers (1
dense + the rest MoE; 0 = the preset's 12) at `--small_batch` x `--small_seq`, float32
and no remat (the preset trains in bfloat16 with remat on one GPU). Last lines:
`throughput_ratio_vs_hf_<preset>=X` (ours / peer tokens per second; > 1: we are faster).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from absl import app, flags
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from composer_jax.hf import config_map
from composer_jax.model import config as model_config
from composer_jax.model import loss as model_loss
from composer_jax.model import transformer
from experiments.bench import timing

_PRESETS = flags.DEFINE_list("presets", ["tiny", "small"], "Model presets to compare.")
_TINY_BATCH = flags.DEFINE_integer("tiny_batch", 16, "Rows per step for tiny.")
_TINY_SEQ = flags.DEFINE_integer("tiny_seq", 128, "Tokens per row for tiny.")
_SMALL_BATCH = flags.DEFINE_integer("small_batch", 2, "Rows per step for small.")
_SMALL_SEQ = flags.DEFINE_integer("small_seq", 128, "Tokens per row for small.")
_SMALL_LAYERS = flags.DEFINE_integer("small_layers", 4, "small's num_layers (0 = preset's).")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds (one step of each side per round).")
_LR = 1e-4


def _ours(cfg: model_config.ModelConfig, tokens: np.ndarray):
  """A no-argument call running one jitted train step of ours (state kept between calls)."""
  variables = transformer.init(cfg, jax.random.key(0))
  tx = optax.adamw(_LR)
  inputs, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
  mask = jnp.ones(inputs.shape, jnp.float32)

  def loss_fn(params):
    hidden, _ = transformer.forward(cfg, {"params": params, "router": variables["router"]},
                                    inputs)
    ce, _ = model_loss.chunked_cross_entropy(hidden, transformer.output_head(cfg, params),
                                             targets, mask)
    return ce

  @jax.jit
  def step(params, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  state = [variables["params"], tx.init(variables["params"])]

  def call():
    state[0], state[1], loss = step(*state)
    return loss

  return call


def _peer(cfg: model_config.ModelConfig, tokens: np.ndarray):
  """A no-argument call running one eager train step of transformers' DeepSeek-V3."""
  hf_cfg = DeepseekV3Config(**config_map.to_hf(cfg, torch_dtype="float32"))
  hf_cfg._attn_implementation = "sdpa"
  torch.manual_seed(0)
  model = DeepseekV3ForCausalLM(hf_cfg).float().train()
  opt = torch.optim.AdamW(model.parameters(), lr=_LR)
  ids = torch.from_numpy(tokens.astype(np.int64))

  def call():
    # transformers shifts labels itself: logits at i predict token i + 1 (as ours).
    loss = model(input_ids=ids[:, :-1], labels=ids[:, :-1]).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss

  return call


def _sizes(preset: str) -> tuple[model_config.ModelConfig, int, int]:
  cfg = model_config.get_preset(preset).replace(dtype="float32", param_dtype="float32",
                                                remat_policy="none")
  if preset == "tiny":
    return cfg, _TINY_BATCH.value, _TINY_SEQ.value
  if _SMALL_LAYERS.value:
    cfg = cfg.replace(num_layers=_SMALL_LAYERS.value,
                      first_k_dense_replace=min(cfg.first_k_dense_replace,
                                                _SMALL_LAYERS.value - 1))
  return cfg, _SMALL_BATCH.value, _SMALL_SEQ.value


def main(argv):
  del argv
  print(f"device: {jax.devices()[0].device_kind}, torch threads: {torch.get_num_threads()}")
  ratios = {}
  for preset in _PRESETS.value:
    cfg, batch, seq = _sizes(preset)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq + 1))
    t0 = time.perf_counter()
    calls = {"ours": _ours(cfg, tokens), "transformers": _peer(cfg, tokens)}
    times = timing.interleaved(calls, _ROUNDS.value, jax.block_until_ready)
    print(f"{preset} (layers={cfg.num_layers}, experts={cfg.n_routed_experts}, batch={batch}, "
          f"seq={seq}, float32, fwd+bwd+AdamW, median of {_ROUNDS.value} interleaved rounds, "
          f"{time.perf_counter() - t0:.0f} s in all):")
    for name, step in times.items():
      print(f"  {name:12s} step {1e3 * step:9.1f} ms, {batch * seq / step:9.0f} tokens/s")
    ratios[preset] = times["transformers"] / times["ours"]
  for preset, ratio in ratios.items():
    print(f"throughput_ratio_vs_hf_{preset}={ratio:.2f}")


if __name__ == "__main__":
  app.run(main)
