"""The grain pipeline: determinism, splits, epochs, sharding, exact resume, errors."""

import hashlib
import itertools
import json
import string

import chex
import numpy as np
import pytest
from ml_collections import ConfigDict

from composer_jax.data import default_config, make_iterator

BOS, EOS, PAD = 256, 257, 258
L = 16
FRACTION = 0.25
# File i holds one letter repeated, so every non-special token names its file.
LETTERS = string.ascii_letters[:40]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus")
  for i, letter in enumerate(LETTERS):
    (root / f"doc{i:02d}.txt").write_text(letter * (5 + (7 * i) % 53))
  return root


@pytest.fixture(scope="module")
def cfg(corpus_dir):
  return ConfigDict({**default_config(), "paths": str(corpus_dir), "validation_fraction": FRACTION})


def _is_validation(i):  # The split rule, recomputed independently.
  digest = hashlib.sha256(f"doc{i:02d}.txt".encode()).digest()
  return int.from_bytes(digest[:8], "big") / 2**64 < FRACTION


def _letters(split):
  return {ord(c) for i, c in enumerate(LETTERS) if _is_validation(i) == (split == "validation")}


def _num_rows(split):  # ceil(stream length / L); each document adds BOS and EOS.
  tokens = sum(
    5 + (7 * i) % 53 + 2
    for i in range(len(LETTERS))
    if _is_validation(i) == (split == "validation")
  )
  return -(-tokens // L)


def _take(it, n):
  return [next(it) for _ in range(n)]


def _rows(batches):
  return [r for b in batches for r in b["tokens"].tolist()]


def test_batch_shapes_and_dtypes(cfg):
  (batch,) = _take(make_iterator(cfg, seq_len=L, batch_size=4, seed=0), 1)
  chex.assert_shape(list(batch.values()), (4, L))
  for key in ("tokens", "targets", "segment_ids", "positions"):
    chex.assert_type(batch[key], np.int32)
  chex.assert_type(batch["loss_mask"], np.float32)
  assert batch["tokens"].max() < 259


def test_same_seed_same_batches_other_seed_other_batches(cfg):
  first = _take(make_iterator(cfg, seq_len=L, batch_size=4, seed=3), 5)
  chex.assert_trees_all_equal(first, _take(make_iterator(cfg, seq_len=L, batch_size=4, seed=3), 5))
  other = _take(make_iterator(cfg, seq_len=L, batch_size=4, seed=4), 5)
  assert _rows(first) != _rows(other)


@pytest.mark.parametrize("split", ["train", "validation"])
def test_splits_hold_their_files_only_and_targets_stay_in_document(cfg, split):
  it = make_iterator(cfg, seq_len=L, batch_size=4, split=split, seed=0)
  batches = list(it) if split == "validation" else _take(it, _num_rows("train") // 4 + 1)
  tokens = np.concatenate([b["tokens"] for b in batches])
  assert set(np.unique(tokens)) - {BOS, EOS, PAD} == _letters(split)
  for b in batches:
    on = b["loss_mask"] == 1
    tok, tgt = b["tokens"][on], b["targets"][on]
    assert np.all((tgt == tok) | (tgt == EOS) | (tok == BOS) & np.isin(tgt, list(_letters(split))))
    assert not np.any(on & (b["tokens"] == EOS))


@pytest.mark.parametrize("split, skip", [("train", 3), ("train", 20), ("validation", 2)])
def test_resume_from_saved_state(cfg, split, skip):
  it = make_iterator(cfg, seq_len=L, batch_size=4, split=split, seed=7)
  _take(it, skip)
  state = json.loads(json.dumps(it.get_state()))  # What a checkpoint stores.
  expected = list(itertools.islice(it, 4))  # Validation may end sooner.
  assert expected
  fresh = make_iterator(cfg, seq_len=L, batch_size=4, split=split, seed=7)
  fresh.set_state(state)
  chex.assert_trees_all_equal(list(itertools.islice(fresh, 4)), expected)


def test_epochs_cover_all_rows_and_reshuffle(cfg):
  n = _num_rows("train")
  rows = _rows(_take(make_iterator(cfg, seq_len=L, batch_size=1, seed=5), 2 * n))
  epoch1, epoch2 = rows[:n], rows[n:]
  assert sorted(epoch1) == sorted(epoch2)  # Same rows each epoch...
  assert epoch1 != epoch2  # ...in a new order.
  num_real = sum(any(t != PAD for t in r) for r in epoch1)
  assert num_real == n  # Train has no all-padding rows.


@pytest.mark.parametrize("process_count", [2, 3])
def test_train_process_shards_are_disjoint_and_cover_each_epoch(cfg, process_count):
  n = _num_rows("train")
  per = n // process_count
  single = _rows(_take(make_iterator(cfg, seq_len=L, batch_size=1, seed=5), 2 * n))
  for p in range(process_count):
    it = make_iterator(
      cfg, seq_len=L, batch_size=1, seed=5, process_index=p, process_count=process_count
    )
    got = _rows(_take(it, 2 * per))
    # Process p takes every process_count-th row of the same global permutation per epoch.
    for epoch in range(2):
      global_order = single[epoch * n : epoch * n + per * process_count]
      assert got[epoch * per : (epoch + 1) * per] == global_order[p::process_count]


def test_validation_is_fixed_padded_and_sharded(cfg):
  def run(**kw):
    return list(make_iterator(cfg, seq_len=L, batch_size=2, split="validation", **kw))

  single = run(seed=0)
  chex.assert_trees_all_equal(single, run(seed=123))  # Independent of the training seed.
  chex.assert_trees_all_equal(
    single[:2],
    list(itertools.islice(make_iterator(cfg, seq_len=L, batch_size=2, split="validation"), 2)),
  )
  tokens = np.concatenate([b["tokens"] for b in single])
  assert np.sum(tokens != PAD) == sum(5 + (7 * i) % 53 + 2 for i in range(40) if _is_validation(i))
  shards = [run(seed=0, process_index=p, process_count=3) for p in range(3)]
  assert len({len(s) for s in shards}) == 1  # Every process runs the same number of steps.
  interleaved = [r for rows in zip(*(_rows(s) for s in shards)) for r in rows]
  real = [r for r in interleaved if any(t != PAD for t in r)]
  assert real == [r for r in _rows(single) if any(t != PAD for t in r)]


def test_tiktoken_tokenizer_in_pipeline(tmp_path, tiny_tiktoken):
  (tmp_path / "text.md").write_text("hello hello")
  data_cfg = ConfigDict(
    {"paths": str(tmp_path / "text.md"), "tokenizer": tiny_tiktoken, "validation_fraction": 0.0}
  )
  (batch,) = _take(make_iterator(data_cfg, seq_len=8, batch_size=1, seed=0), 1)
  # Specials sit at Kimi's offsets after the 259 ranks: BOS +0 = 259, EOS +1 = 260, PAD +255 = 514
  # (as [PAD] 163839 = 163584 + 255); "hello hello" -> [258, 111, 32, 258, 111].
  np.testing.assert_array_equal(batch["tokens"][0], [259, 258, 111, 32, 258, 111, 260, 514])
  np.testing.assert_array_equal(batch["targets"][0], [258, 111, 32, 258, 111, 260, 514, 514])


def test_stdlib_default_corpus():
  it = make_iterator(default_config(), seq_len=128, batch_size=2, seed=0)
  batch = next(it)
  assert batch["tokens"].max() < 259 and batch["loss_mask"].sum() > 0


@pytest.mark.parametrize(
  "overrides, kwargs, match",
  [
    ({"paths": "/no/such/dir"}, {}, "/no/such/dir"),
    ({"validation_fraction": 0.0}, {"split": "validation"}, "no non-empty validation files"),
    ({}, {"process_index": 2, "process_count": 2}, "process_index=2"),
    ({}, {"process_count": 10_000}, "process_count=10000"),
    ({}, {"seed": -1}, "seed=-1"),
    ({}, {"batch_size": 0}, "batch_size=0"),
  ],
)
def test_bad_input(cfg, overrides, kwargs, match):
  data_cfg = ConfigDict({**cfg, **overrides})
  with pytest.raises(ValueError, match=match):
    make_iterator(data_cfg, **{"seq_len": L, "batch_size": 4, "seed": 0, **kwargs})
