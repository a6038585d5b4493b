"""The grain input pipeline: packed rows -> (shuffled, per-process, repeated) batches.

Train: documents in a seeded order are packed into rows (packing.py); grain shuffles the rows
globally with a new permutation each epoch (`MapDataset.shuffle` before `repeat` folds the
epoch into the seed), each process takes every `process_count`-th row of that permutation
(disjoint, and together covering all but the < process_count leftover rows of the epoch), and
batches run across epoch boundaries, so every batch is full. Validation: a fixed,
seed-independent order, one pass, padded with all-padding rows (loss_mask 0) so that every
process gets the same number of full batches; `itertools.islice(it, n)` takes its first n.

The iterator is grain's: `get_state()` is a small JSON-able dict, `set_state()` resumes exactly.
"""

import grain
import ml_collections
import numpy as np

from composer_jax.data import corpus as corpus_lib
from composer_jax.data.packing import PackedRows
from composer_jax.data.tokenizer import load_tokenizer

# Rows are cheap numpy slices of an in-memory stream: one background thread keeping two batches
# ready overlaps input with the train step without competing for cores.
READ_OPTIONS = grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)


def default_config() -> ml_collections.ConfigDict:
  """The run config's `data` section (`make_iterator`'s `data_cfg`): paths '' = the stdlib's
  .py sources."""
  return ml_collections.ConfigDict(
    {
      "paths": "",  # Comma-separated string or list of files / directories.
      "tokenizer": "byte",  # 'byte', a tiktoken file, or a directory holding tiktoken.model.
      "validation_fraction": 0.05,  # Share of files (by stable path hash) held out.
      "seed": 0,  # Used when make_iterator gets no seed.
    }
  )


def _dataset(data_cfg, seq_len, batch_size, split, seed, process_index, process_count):
  """Builds the grain MapDataset of batches; see the module docstring."""
  if batch_size < 1 or seq_len < 1:
    raise ValueError(f"batch_size={batch_size} and seq_len={seq_len} must be >= 1")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} must be in [0, {process_count})")
  paths = data_cfg.get("paths", "")
  fraction = data_cfg.get("validation_fraction", 0.05)
  tokenizer = load_tokenizer(data_cfg)
  all_files = corpus_lib.discover_files(paths)
  files = corpus_lib.split_files(all_files, split, fraction)
  if split == "validation":
    # A seed-independent order that is not alphabetical, so a first-n-batches eval is not
    # all from one package.
    files.sort(key=lambda f: corpus_lib.stable_fraction(f.key))
  corpus = corpus_lib.load_corpus(files, tokenizer)
  if not len(corpus.tokens):
    raise ValueError(
      f"no non-empty {split} files among the {len(all_files)} files of data paths {paths!r} "
      f"(validation_fraction={fraction})"
    )
  if split == "validation":
    rows = PackedRows(corpus, seq_len, tokenizer.pad_id, row_multiple=process_count * batch_size)
    return grain.MapDataset.source(rows)[process_index::process_count].batch(batch_size)
  num_docs = len(corpus.starts) - 1
  corpus = corpus_lib.permute_documents(corpus, np.random.default_rng(seed).permutation(num_docs))
  rows = PackedRows(corpus, seq_len, tokenizer.pad_id)
  rows_per_process = len(rows) // process_count
  if rows_per_process == 0:
    raise ValueError(
      f"{len(rows)} rows of seq_len={seq_len} from data paths {paths!r} cannot feed "
      f"process_count={process_count} processes"
    )
  return (
    grain.MapDataset.source(rows)
    .shuffle(seed=seed)
    .slice(slice(process_index, rows_per_process * process_count, process_count))
    .repeat(None)
    .batch(batch_size, drop_remainder=True)
  )


def make_iterator(
  data_cfg: ml_collections.ConfigDict,
  *,
  seq_len: int,
  batch_size: int,
  split: str = "train",
  seed: int | None = None,
  process_index: int = 0,
  process_count: int = 1,
) -> grain.DatasetIterator:
  """Returns a grain iterator over packed batches of this process's rows.

  Args:
    data_cfg: fields of `default_config()` (missing ones take its defaults).
    seq_len: L, tokens per row.
    batch_size: B, rows per batch for this process.
    split: 'train' (infinite, reshuffled every epoch) or 'validation' (one fixed pass).
    seed: shuffle seed in [0, 2**32); None -> data_cfg.seed. Same on every process.
    process_index, process_count: this process's share of rows, e.g. jax.process_index().

  Returns:
    Iterator with get_state()/set_state() yielding numpy dicts: tokens, targets,
    segment_ids (0 = padding), positions: [B, L] int32; loss_mask: [B, L] float32.
  """
  seed = data_cfg.get("seed", 0) if seed is None else seed
  if not 0 <= seed < 2**32:
    raise ValueError(f"seed={seed} must be in [0, 2**32)")
  ds = _dataset(data_cfg, seq_len, batch_size, split, seed, process_index, process_count)
  return iter(ds.to_iter_dataset(READ_OPTIONS))
