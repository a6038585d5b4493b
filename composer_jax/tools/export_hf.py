"""Exports our checkpoint to a Hugging Face `deepseek_v3` checkpoint for serving.

  python -m composer_jax.tools.export_hf --ckpt DIR --out DIR [--dtype bfloat16] [--fp8]

`--ckpt` is a directory written by `import_hf` (config.json + orbax `variables`). Each
HF tensor is read on its own from the stored zarr arrays (host memory: one tensor plus
one shard); `--fp8` re-quantizes decoder Linear weights to DeepSeek-V3 128x128 block fp8.
"""

from absl import app, flags, logging

from composer_jax.hf import checkpoint, writer

_CKPT = flags.DEFINE_string("ckpt", None, "Our checkpoint directory.", required=True)
_OUT = flags.DEFINE_string("out", None, "Output HF checkpoint directory.", required=True)
_DTYPE = flags.DEFINE_string("dtype", "bfloat16", "dtype of unquantized tensors.")
_FP8 = flags.DEFINE_bool("fp8", False, "Store decoder Linear weights as block fp8.")


def main(argv):
  del argv
  cfg = checkpoint.load_config(_CKPT.value)
  writer.export_hf(cfg, lambda path: checkpoint.open_leaf(_CKPT.value, path), _OUT.value,
                   dtype=_DTYPE.value, fp8=_FP8.value)
  logging.info("Exported %s to %s", _CKPT.value, _OUT.value)


if __name__ == "__main__":
  app.run(main)
