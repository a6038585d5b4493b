"""Tokenizers: a byte-level default and tiktoken-format BPE files (as Kimi K2 ships them).

Both expose the same small interface: `encode(str) -> list[int]`, `decode(ids) -> str`,
`encode_documents(list[bytes]) -> list[np.ndarray]` (the fast batched path the corpus uses),
`vocab_size`, `bos_id`, `eos_id`, `pad_id`. Special tokens sit right after the base vocabulary,
in the order BOS, EOS, PAD, so `vocab_size = base + 3`. For Kimi K2's `tiktoken.model`
(163,584 ranks) that gives BOS 163584 and EOS 163585, the ids of Kimi's `[BOS]` / `[EOS]`.
"""

import base64
import dataclasses
import functools
import os
from collections.abc import Sequence

import numpy as np
import tiktoken

TIKTOKEN_FILENAME = "tiktoken.model"

# The pre-tokenization regex of Kimi K2's tokenizer (tokenization_kimi.py), used for every
# tiktoken file. Pieces, in order of priority:
#   1. runs of Han characters (CJK is split from Latin before BPE);
#   2./3. an optional leading non-letter/digit, then a word in mixed case (letters and marks,
#      Han excluded), with English contractions ('s 't 're 've 'm 'll 'd) glued on;
#   4. numbers in chunks of at most 3 digits;
#   5. an optional space, then a run of punctuation/symbols with trailing newlines;
#   6. whitespace ending in newlines (indentation + line breaks stay one piece);
#   7./8. other whitespace, leaving a single space for the next word to take.
KIMI_PATTERN = "|".join(
  [
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
  ]
)


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
  """UTF-8 bytes 0..255, then BOS 256, EOS 257, PAD 258 (vocab 259)."""

  bos_id: int = 256
  eos_id: int = 257
  pad_id: int = 258
  vocab_size: int = 259

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def decode(self, ids: Sequence[int]) -> str:
    return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

  def encode_documents(self, documents: Sequence[bytes]) -> list[np.ndarray]:
    # frombuffer is a zero-copy view: tokenizing the stdlib (~12 MB) costs nothing here.
    return [np.frombuffer(doc, dtype=np.uint8) for doc in documents]


class TiktokenTokenizer:
  """Byte-level BPE from a tiktoken file (one `base64(token) rank` pair per line)."""

  def __init__(self, path: str):
    self.path = path
    ranks = _read_ranks(path)
    base = len(ranks)
    self.bos_id, self.eos_id, self.pad_id = base, base + 1, base + 2
    self.vocab_size = base + 3
    self._encoding = tiktoken.Encoding(
      name=os.path.basename(path),
      pat_str=KIMI_PATTERN,
      mergeable_ranks=ranks,
      special_tokens={"[BOS]": self.bos_id, "[EOS]": self.eos_id, "[PAD]": self.pad_id},
    )

  def encode(self, text: str) -> list[int]:
    # Raw corpora may contain the literal text "[EOS]"; it must stay plain text.
    return self._encoding.encode_ordinary(text)

  def decode(self, ids: Sequence[int]) -> str:
    specials = (self.bos_id, self.eos_id, self.pad_id)
    return self._encoding.decode([int(i) for i in ids if int(i) not in specials])

  def encode_documents(self, documents: Sequence[bytes]) -> list[np.ndarray]:
    texts = [doc.decode("utf-8", errors="replace") for doc in documents]
    # tiktoken releases the GIL while encoding, so a thread per core helps.
    encoded = self._encoding.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)
    return [np.asarray(ids, dtype=np.int32) for ids in encoded]


def _read_ranks(path: str) -> dict[bytes, int]:
  """Parses a tiktoken file; ranks must be exactly 0..n-1 so the special ids follow them.

  Parsed here rather than with `tiktoken.load.load_tiktoken_bpe`, which caches file contents
  in a temp dir keyed by the path only, so a changed file at the same path reads stale.
  """
  ranks = {}
  with open(path, "rb") as f:
    for line_number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        token, rank = line.split()
        ranks[base64.b64decode(token, validate=True)] = int(rank)
      except ValueError as e:
        raise ValueError(f"{path}:{line_number}: expected 'base64_token rank', got {line!r}") from e
  if sorted(ranks.values()) != list(range(len(ranks))):
    raise ValueError(f"{path}: ranks must be exactly 0..{len(ranks) - 1} with no gaps or repeats")
  return ranks


def find_tokenizer_near(ckpt_dir: str) -> str | None:
  """Returns `<ckpt_dir>/tiktoken.model` if an imported checkpoint ships one, else None."""
  path = os.path.join(ckpt_dir, TIKTOKEN_FILENAME)
  return path if os.path.isfile(path) else None


@functools.lru_cache(maxsize=4)
def _load_tiktoken(path: str, mtime_ns: int) -> TiktokenTokenizer:
  # Building Kimi's 163k-rank encoder takes ~1 s; cache it per (path, mtime).
  del mtime_ns  # Only part of the cache key.
  return TiktokenTokenizer(path)


def load_tokenizer(data_cfg) -> ByteTokenizer | TiktokenTokenizer:
  """Returns the tokenizer named by `data_cfg.tokenizer`.

  Args:
    data_cfg: has `tokenizer`: 'byte' (default), a tiktoken file, or a directory holding
      `tiktoken.model` (e.g. an imported Kimi checkpoint).
  """
  name = data_cfg.get("tokenizer", "byte") or "byte"
  if name == "byte":
    return ByteTokenizer()
  path = os.path.expanduser(str(name))
  if os.path.isdir(path):
    found = find_tokenizer_near(path)
    if found is None:
      raise ValueError(f"tokenizer directory {path!r} has no {TIKTOKEN_FILENAME}")
    path = found
  if not os.path.isfile(path):
    raise ValueError(f"tokenizer {name!r} is neither 'byte' nor an existing tiktoken file")
  path = os.path.abspath(path)
  return _load_tiktoken(path, os.stat(path).st_mtime_ns)
