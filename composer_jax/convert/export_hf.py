"""Exports a checkpoint to a Hugging Face `deepseek_v3` checkpoint for serving.

  python -m composer_jax.convert.export_hf --ckpt DIR --out DIR [--dtype bfloat16] [--fp8] [--overwrite]
      [--tokenizer byte|FILE]

`--ckpt` is any checkpoint `train.load_checkpoint` reads: a directory written by `import_hf`
(config.json + orbax `variables`), whose HF tensors are read one at a time from the stored
zarr arrays (host memory: one tensor plus one shard), or a training / RL workdir (its newest
checkpoint) or an HF directory, read whole into host memory (small models). `--fp8`
re-quantizes decoder Linear weights to DeepSeek-V3 128x128 block fp8.

Beside the weights go the tokenizer files and `generation_config.json` (`hf.tokenizer_files`),
so `AutoTokenizer.from_pretrained(out)`, `AutoModelForCausalLM.from_pretrained(out)` and
`generate` work on `--out`. The tokenizer is `--tokenizer` ('byte', a tiktoken file or a
directory holding `tiktoken.model`), by default the checkpoint's own: a supervised workdir's
`data.tokenizer`, else a `tiktoken.model` in `--ckpt` (an imported checkpoint's, a coding RL
workdir's). Without one, the weights are exported alone and a warning says so.

`--out` is never the checkpoint, inside it or around it, and must be new or empty, or with
`--overwrite` an earlier export (an HF directory), which is then replaced as a whole; no other
directory is ever replaced. The export is written to a temporary
directory beside `--out` that takes its place only when complete (`convert.outputs`), so a
failed or interrupted export (disk full, Ctrl-C) leaves `--out` as it was. Bad input exits
with one line.
"""

import functools
import sys

from absl import app, flags, logging

from composer_jax import data
from composer_jax.convert import outputs
from composer_jax.hf import checkpoint, tokenizer_files, writer
from composer_jax.model.config import DTYPES
from composer_jax.parallel import backend
from composer_jax.train import load_checkpoint

_CKPT = flags.DEFINE_string("ckpt", None, "Checkpoint directory (module docstring).", required=True)
_OUT = flags.DEFINE_string("out", None, "Output HF checkpoint directory.", required=True)
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", DTYPES, "dtype of unquantized tensors.")
_FP8 = flags.DEFINE_bool("fp8", False, "Store decoder Linear weights as block fp8.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier export in --out.")
_TOKENIZER = flags.DEFINE_string(
  "tokenizer",
  None,
  "Tokenizer written beside the weights: 'byte', a tiktoken file or a directory holding "
  "tiktoken.model. Default: the checkpoint's own (module docstring).",
)


def _source(path: str):
  """(model config, get(path) -> array) of the checkpoint at `path`."""
  if load_checkpoint.kind(path) == "imported":  # lazy: one tensor at a time
    return checkpoint.load_config(path), lambda p: checkpoint.open_leaf(path, p)
  cfg, variables = load_checkpoint.load(path)
  return cfg, lambda p: writer.leaf(variables, p)


def _tokenizer(path: str, vocab_size: int):
  """The tokenizer to write beside the export of `path` (module docstring), or None."""
  name = _TOKENIZER.value
  if not name and load_checkpoint.kind(path) == "workdir":
    run = load_checkpoint.run_config(path)
    if run.get("method") == "lm":
      name = run.get("data", {}).get("tokenizer")
  name = name or data.find_tokenizer_near(path)
  if not name:
    return None
  tokenizer = data.load_tokenizer({"tokenizer": name})
  if tokenizer.vocab_size > vocab_size:
    raise ValueError(
      f"--tokenizer {name!r} has {tokenizer.vocab_size} ids, more than the model's "
      f"vocab_size {vocab_size}"
    )
  return tokenizer


def main(argv):
  del argv
  backend.ready_or_exit()
  try:
    out = outputs.check(
      _OUT.value,
      inputs=[_CKPT.value],
      overwrite=_OVERWRITE.value,
      is_own=(
        functools.partial(load_checkpoint.is_kind, layout="hf"),
        load_checkpoint.LAYOUTS["hf"],
      ),
    )
    cfg, get = _source(_CKPT.value)
    tokenizer = _tokenizer(_CKPT.value, cfg.vocab_size)
    with outputs.staged(out) as tmp:
      writer.export_hf(cfg, get, tmp, dtype=_DTYPE.value, fp8=_FP8.value)
      if tokenizer is not None:
        tokenizer_files.write_tokenizer(tokenizer, tmp)
  except (ValueError, OSError) as e:
    sys.exit(f"error: {e}")
  if tokenizer is None:
    logging.warning(
      "No tokenizer known for --ckpt %s: exported the weights without tokenizer files; pass "
      "--tokenizer=byte or a tiktoken file to write them",
      _CKPT.value,
    )
  logging.info("Exported %s to %s", _CKPT.value, out)


if __name__ == "__main__":
  app.run(main)
