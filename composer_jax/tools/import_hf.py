"""Imports a Hugging Face DeepSeek-V3 / Kimi-K2 checkpoint into our checkpoint format.

  python -m composer_jax.tools.import_hf --hf-dir DIR --out DIR [--dtype bfloat16]

Streams one tensor at a time (fp8 / int4 weights dequantized on the fly) and writes
`OUT/config.json` (our ModelConfig) + `OUT/variables` (orbax); see composer_jax.hf.
A bad checkpoint (missing, empty, truncated or cut shard, unreadable config.json, an
unsupported model_type, tensors that do not match the config) exits with one line naming
the file.
"""

import sys

from absl import app, flags, logging

from composer_jax.hf import importer

_HF_DIR = flags.DEFINE_string("hf_dir", None, "HF checkpoint dir (config.json + *.safetensors); "
                              "--hf-dir also works.", required=True)
_OUT = flags.DEFINE_string("out", None, "Output checkpoint directory.", required=True)
_DTYPE = flags.DEFINE_string("dtype", "float32", "Parameter dtype: float32 or bfloat16.")


def _parse_flags(argv):
  # Accept `--hf-dir` (the documented spelling) as well as absl's `--hf_dir`.
  return flags.FLAGS([a.replace("--hf-dir", "--hf_dir", 1) if a.startswith("--hf-dir") else a
                      for a in argv])


def main(argv):
  del argv
  try:
    cfg = importer.import_to_checkpoint(_HF_DIR.value, _OUT.value, dtype=_DTYPE.value)
  except (ValueError, OSError) as e:
    sys.exit(f"error: {e}")
  logging.info("Imported %d layers (%d MoE) to %s", cfg.num_layers, cfg.num_moe_layers,
               _OUT.value)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
