"""Packing against a hand-built example and a naive token-by-token reference."""

import chex
import numpy as np
import pytest

from composer_jax.data.corpus import Corpus
from composer_jax.data.packing import PackedRows

BOS, EOS, PAD = 10, 11, 12


def _corpus(docs):
  """Docs (lists of ints) -> Corpus with BOS/EOS, built directly."""
  stream = [t for d in docs for t in [BOS, *d, EOS]]
  starts = np.cumsum([0] + [len(d) + 2 for d in docs])
  return Corpus(np.array(stream, np.int32), starts.astype(np.int64))


def test_hand_built_rows():
  # Stream: [B 1 2 E][B 3 E][B 4 5 6 E] = 12 tokens; L = 5 -> 3 rows; row_multiple=2 adds an all-padding 4th.
  rows = PackedRows(_corpus([[1, 2], [3], [4, 5, 6]]), seq_len=5, pad_id=PAD, row_multiple=2)
  P = PAD
  expected = [
    # Row 0: doc 0 whole, doc 1 starts.
    dict(
      tokens=[BOS, 1, 2, EOS, BOS],
      targets=[1, 2, EOS, P, 3],
      loss_mask=[1, 1, 1, 0, 1],
      segment_ids=[1, 1, 1, 1, 2],
      positions=[0, 1, 2, 3, 0],
    ),
    # Row 1: rest of doc 1 (positions restart), doc 2 starts; last target is in row 2.
    dict(
      tokens=[3, EOS, BOS, 4, 5],
      targets=[EOS, P, 4, 5, 6],
      loss_mask=[1, 0, 1, 1, 1],
      segment_ids=[1, 1, 2, 2, 2],
      positions=[0, 1, 0, 1, 2],
    ),
    # Row 2: end of doc 2, then padding.
    dict(
      tokens=[6, EOS, P, P, P],
      targets=[EOS, P, P, P, P],
      loss_mask=[1, 0, 0, 0, 0],
      segment_ids=[1, 1, 0, 0, 0],
      positions=[0, 1, 0, 0, 0],
    ),
    # Row 3: padding only.
    dict(
      tokens=[P] * 5, targets=[P] * 5, loss_mask=[0] * 5, segment_ids=[0] * 5, positions=[0] * 5
    ),
  ]
  assert (len(rows), rows.num_real_rows) == (4, 3)
  for row, want in enumerate(expected):
    got = rows[row]
    for key, value in want.items():
      dtype = np.float32 if key == "loss_mask" else np.int32
      chex.assert_trees_all_equal(got[key], np.array(value, dtype), custom_message=f"{row=} {key}")


def _naive_rows(docs, seq_len):
  """Walks the documents token by token; an independent reference for PackedRows."""
  flat = []  # (token, doc, target or None)
  for d, doc in enumerate(docs):
    seq = [BOS, *doc, EOS]
    flat += [(t, d, seq[k + 1] if k + 1 < len(seq) else None) for k, t in enumerate(seq)]
  rows = []
  for start in range(0, len(flat), seq_len):
    chunk = flat[start : start + seq_len]
    row = {k: [] for k in ("tokens", "targets", "loss_mask", "segment_ids", "positions")}
    seen_docs, prev_doc, pos = [], None, 0
    for token, d, target in chunk:
      if d != prev_doc:
        seen_docs.append(d)
        prev_doc, pos = d, 0
      row["tokens"].append(token)
      row["targets"].append(PAD if target is None else target)
      row["loss_mask"].append(0.0 if target is None else 1.0)
      row["segment_ids"].append(len(seen_docs))
      row["positions"].append(pos)
      pos += 1
    for key, fill in (
      ("tokens", PAD),
      ("targets", PAD),
      ("loss_mask", 0.0),
      ("segment_ids", 0),
      ("positions", 0),
    ):
      row[key] += [fill] * (seq_len - len(chunk))
    rows.append(row)
  return rows


@pytest.mark.parametrize("seq_len", [1, 3, 8, 64])
def test_matches_naive_reference(seq_len):
  rng = np.random.default_rng(seq_len)
  docs = [list(rng.integers(0, 10, size=n)) for n in rng.integers(1, 40, size=12)]
  rows = PackedRows(_corpus(docs), seq_len=seq_len, pad_id=PAD)
  want = _naive_rows(docs, seq_len)
  assert len(rows) == len(want)
  for r, w in enumerate(want):
    got = rows[r]
    for key in w:
      np.testing.assert_array_equal(got[key], w[key], err_msg=f"row {r} {key}")


def test_no_cross_document_targets():
  # Every token of document d is the value d, so a target from another document shows.
  docs = [[d] * n for d, n in enumerate([5, 1, 9, 2, 17, 3])]
  rows = PackedRows(_corpus(docs), seq_len=7, pad_id=PAD)
  for r in range(len(rows)):
    row = rows[r]
    for j in np.flatnonzero(row["loss_mask"]):
      token, target = row["tokens"][j], row["targets"][j]
      assert token != EOS, (r, j)  # A document's last token has nothing to predict.
      allowed = range(len(docs)) if token == BOS else (token, EOS)
      assert target in allowed, (r, j, token, target)


@pytest.mark.parametrize(
  "kwargs, error",
  [
    (dict(seq_len=0), ValueError),
    (dict(seq_len=4, row_multiple=0), ValueError),
  ],
)
def test_bad_arguments(kwargs, error):
  with pytest.raises(error):
    PackedRows(_corpus([[1, 2, 3]]), pad_id=PAD, **kwargs)


def test_row_out_of_range():
  with pytest.raises(IndexError, match="row 2"):
    PackedRows(_corpus([[1]]), seq_len=3, pad_id=PAD)[2]
