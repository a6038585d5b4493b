"""Concatenate-then-split packing of a token stream into fixed-length rows, lazily per row.

Row r holds stream tokens [r*L, (r+1)*L) (L = seq_len); only the last real row is padded.
Within a row every document piece gets its own segment id (1, 2, ... in order; 0 = padding)
and positions restarting at 0, so with segment-masked attention no token ever attends across
documents (the model's `segment_ids` / `positions` contract). Positions restart even for a
piece that continues a document from the previous row: that piece cannot see its earlier
part, and with RoPE only position differences matter inside a piece.

The target of a token is the next token of the same document, which for the last token of a
row is the first token of the next row; `loss_mask` is 0 only where the document has no next
token (its EOS) and on padding. So every token but EOS gets a prediction, and no target
ever crosses a document boundary.
"""

import numpy as np

from composer_jax.data.corpus import Corpus


class PackedRows:
  """A grain random-access source: row index -> dict of [seq_len] arrays.

  `len(self)` is the number of real rows (`num_real_rows`) rounded up to a multiple of
  `row_multiple`; the extra rows are all padding. They let every process and batch be full
  (static shapes) without repeating data.
  """

  def __init__(self, corpus: Corpus, seq_len: int, pad_id: int, row_multiple: int = 1):
    if seq_len < 1 or row_multiple < 1:
      raise ValueError(f"seq_len={seq_len} and row_multiple={row_multiple} must be >= 1")
    if not len(corpus.tokens):
      raise ValueError("cannot pack an empty corpus")
    self._tokens, self._starts = corpus.tokens, corpus.starts
    self._seq_len, self._pad_id = seq_len, pad_id
    self.num_real_rows = -(-len(self._tokens) // seq_len)
    self._len = -(-self.num_real_rows // row_multiple) * row_multiple

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, row: int) -> dict[str, np.ndarray]:
    """Returns tokens, targets, segment_ids, positions ([L] int32) and loss_mask ([L] f32)."""
    if not 0 <= row < self._len:
      raise IndexError(f"row {row} out of range [0, {self._len})")
    num_tokens = len(self._tokens)
    row_start = row * self._seq_len
    index = row_start + np.arange(self._seq_len, dtype=np.int64)  # [L] stream offsets
    valid = index < num_tokens
    index = np.minimum(index, num_tokens - 1)
    doc = np.searchsorted(self._starts, index, side="right") - 1  # [L] document of each token
    doc_start, doc_end = self._starts[doc], self._starts[doc + 1]
    has_next = valid & (index + 1 < doc_end)
    pad, stream = self._pad_id, self._tokens
    return {
      "tokens": np.where(valid, stream[index], pad).astype(np.int32),
      "targets": np.where(has_next, stream[np.minimum(index + 1, num_tokens - 1)], pad).astype(
        np.int32
      ),
      "loss_mask": has_next.astype(np.float32),
      "segment_ids": np.where(valid, doc - doc[0] + 1, 0).astype(np.int32),
      "positions": np.where(valid, index - np.maximum(doc_start, row_start), 0).astype(np.int32),
    }
