"""Imports a Hugging Face DeepSeek-V3 / Kimi-K2 checkpoint into our checkpoint format.

  python -m composer_jax.convert.import_hf --hf-dir DIR --out DIR [--dtype bfloat16] [--overwrite]

Streams one tensor at a time (fp8 / int4 weights dequantized on the fly) and writes
`OUT/config.json` (our ModelConfig) + `OUT/variables` (orbax); see composer_jax.hf.
A bad checkpoint (missing, empty, truncated or cut shard, unreadable config.json or one with
a value of the wrong type, an index naming a shard outside the directory, an unsupported
model_type, tensors that do not match the config) exits with one line naming the file.
`--out` is never the HF directory, inside it or around it, and must be new or empty, or with
`--overwrite` an earlier import (config.json + variables/); the import is written beside it and takes its place only when complete
(`convert.outputs`), so a failed import (disk full, a bad tensor) leaves `--out` as it was.
"""

import functools
import sys

from absl import app, flags, logging

from composer_jax.convert import outputs
from composer_jax.hf import importer
from composer_jax.model.config import DTYPES
from composer_jax.parallel import backend
from composer_jax.train import load_checkpoint

_HF_DIR = flags.DEFINE_string(
  "hf_dir",
  None,
  "HF checkpoint dir (config.json + *.safetensors); --hf-dir also works.",
  required=True,
)
_OUT = flags.DEFINE_string("out", None, "Output checkpoint directory.", required=True)
_DTYPE = flags.DEFINE_enum("dtype", "float32", DTYPES, "Parameter dtype.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier import in --out.")


def _parse_flags(argv):
  # Accept `--hf-dir` (the documented spelling) as well as absl's `--hf_dir`.
  return flags.FLAGS(
    [a.replace("--hf-dir", "--hf_dir", 1) if a.startswith("--hf-dir") else a for a in argv]
  )


def main(argv):
  del argv
  backend.ready_or_exit()
  try:
    out = outputs.check(
      _OUT.value,
      inputs=[_HF_DIR.value],
      overwrite=_OVERWRITE.value,
      is_own=(
        functools.partial(load_checkpoint.is_kind, layout="imported"),
        load_checkpoint.LAYOUTS["imported"],
      ),
    )
    with outputs.staged(out) as tmp:
      cfg = importer.import_to_checkpoint(_HF_DIR.value, tmp, dtype=_DTYPE.value)
  except (ValueError, OSError) as e:
    sys.exit(f"error: {e}")
  logging.info("Imported %d layers (%d MoE) to %s", cfg.num_layers, cfg.num_moe_layers, out)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
