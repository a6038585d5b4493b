"""Sampling speed against transformers' `generate`, same model, each side in its own process.

    python -m experiments.bench.vs_hf_generate --presets=tiny,small [--rounds=5]

Both sides sample `--new` tokens after `--batch` prompts of `--prompt` random tokens with
a KV cache, temperature 1, no top-k / top-p, no stop token (every row draws all `--new`
tokens): ours is `composer_jax.rl.decode.sample` (one jitted prefill + `while_loop`;
MLA decodes in the absorbed form on the cached latent), the peer
`DeepseekV3ForCausalLM.generate(do_sample=True, min_new_tokens=max_new_tokens)` with its
default dynamic cache, eager PyTorch, built from `hf.config_map.to_hf` of the same
`ModelConfig`; float32. One side per process (`experiments.bench.versus`: health check,
interleaved rounds, medians on the CPU clock; MFU = model FLOPs of the prefill and every
decoded token (`composer_jax.model.flops`) / time / measured matmul peak: decoding one token
per row is memory- and overhead-bound, so expect a low MFU on both sides).
Last lines: `generate_ratio_vs_hf_<preset>=X` (peer time / ours: > 1 means we are faster).
"""

import numpy as np
from absl import app, flags

from experiments.bench import versus
from experiments.bench.hf_peer import hf_model, model_config

_PRESETS = flags.DEFINE_list("presets", ["tiny", "small"], "Model presets to compare.")
_BATCH = flags.DEFINE_integer("batch", 8, "Prompts (rows) per call.")
_PROMPT = flags.DEFINE_integer("prompt", 64, "Prompt tokens per row.")
_NEW = flags.DEFINE_integer("new", 64, "New tokens per row.")
_SMALL_LAYERS = flags.DEFINE_integer("small_layers", 4, "small's num_layers (0 = preset's).")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed rounds (one call of each side per round).")
_THREADS = flags.DEFINE_integer("threads", 1, "Intra-op threads per side (versus.py says why 1).")


def _prompts(cfg, batch: int, prompt: int) -> np.ndarray:
  return np.random.default_rng(0).integers(1, cfg.vocab_size, (batch, prompt))


def ours_generate(preset: str, layers: int, batch: int, prompt: int, new: int):
  """A call sampling `new` tokens per row with our jitted sampler, waiting for them."""
  import jax

  from composer_jax.model import transformer
  from composer_jax.rl import decode

  cfg = model_config(preset, layers, "cpu")
  variables = transformer.init(cfg, jax.random.key(0))
  prompts = _prompts(cfg, batch, prompt)
  lens = np.full((batch,), prompt, np.int32)
  keys = iter(jax.random.split(jax.random.key(1), 10_000))

  def call():
    out = decode.sample(cfg, variables, prompts, lens, next(keys), max_new_tokens=new)
    jax.block_until_ready(out.tokens)

  return call


def peer_generate(preset: str, layers: int, batch: int, prompt: int, new: int):
  """A call sampling `new` tokens per row with transformers' `generate`."""
  import torch

  cfg = model_config(preset, layers, "cpu")
  model = hf_model(cfg, "cpu").eval()
  ids = torch.from_numpy(_prompts(cfg, batch, prompt).astype(np.int64))

  @torch.inference_mode()
  def call():
    model.generate(
      ids,
      attention_mask=torch.ones_like(ids),
      max_new_tokens=new,
      min_new_tokens=new,
      do_sample=True,
      temperature=1.0,
      top_k=0,
      top_p=1.0,
      pad_token_id=0,
      eos_token_id=None,
    )

  return call


def main(argv):
  del argv
  from composer_jax.model import flops

  b, p, n = _BATCH.value, _PROMPT.value, _NEW.value
  for preset in _PRESETS.value:
    layers = 0 if preset == "tiny" else _SMALL_LAYERS.value
    cfg = model_config(preset, layers, "cpu")
    args = dict(preset=preset, layers=layers, batch=b, prompt=p, new=n)
    model_flops = b * (
      p * flops.forward_flops_per_token(cfg, (p + 1) / 2)
      + n * flops.forward_flops_per_token(cfg, p + (n + 1) / 2)
    )
    sides = [
      versus.Side("ours", "jax", "experiments.bench.vs_hf_generate:ours_generate", args),
      versus.Side("transformers", "torch", "experiments.bench.vs_hf_generate:peer_generate", args),
    ]
    result = versus.compare(
      sides,
      rounds=_ROUNDS.value,
      threads=_THREADS.value,
      flops_per_call=model_flops,
      items_per_call=b * n,
      item="new tokens",
    )
    print(
      f"{preset} (layers={cfg.num_layers}, batch={b}, prompt={p}, new={n}, float32, temperature 1):"
    )
    versus.report(result, f"generate_ratio_vs_hf_{preset}")


if __name__ == "__main__":
  app.run(main)
