"""Tokenizers: a byte-level default and tiktoken-format BPE files (as Kimi K2 ships them).

Both expose the same small interface: `encode(str) -> list[int]`, `decode(ids) -> str`,
`encode_documents(list[bytes]) -> list[np.ndarray]` (the fast batched path the corpus uses),
`vocab_size`, `bos_id`, `eos_id`, `pad_id`. A tiktoken file's special tokens follow Kimi K2.5's
released table (`KIMI_SPECIAL_TOKENS`, the `added_tokens_decoder` of its
`tokenizer_config.json`; see third_party/README.md): 256 ids right after the base vocabulary,
named ones at their published offsets, the rest `<|reserved_token_ID|>`, so
`vocab_size = base + 256`. For Kimi's `tiktoken.model` (163,584 ranks) that is [BOS] 163584,
[EOS] 163585, <|im_end|> 163586, <think> 163606, [PAD] 163839 and vocab 163,840, as released.
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


# Kimi K2.5's special tokens, as offsets from the base vocabulary (163,584 ranks): its
# tokenizer_config.json `added_tokens_decoder` (ids 163584 + offset; K2's table plus the media
# tokens and the single-token think tags). Offsets missing here are `<|reserved_token_ID|>`
# (tokenization_kimi.py), up to NUM_SPECIAL_TOKENS.
KIMI_SPECIAL_TOKENS = {
  0: "[BOS]",
  1: "[EOS]",
  2: "<|im_end|>",
  3: "<|im_user|>",
  4: "<|im_assistant|>",
  6: "<|start_header_id|>",
  7: "<|end_header_id|>",
  9: "[EOT]",
  10: "<|im_system|>",
  11: "<|tool_calls_section_begin|>",
  12: "<|tool_calls_section_end|>",
  13: "<|tool_call_begin|>",
  14: "<|tool_call_argument_begin|>",
  15: "<|tool_call_end|>",
  17: "<|im_middle|>",
  18: "<|media_begin|>",
  19: "<|media_content|>",
  20: "<|media_end|>",
  21: "<|media_pad|>",
  22: "<think>",
  23: "</think>",
  254: "[UNK]",
  255: "[PAD]",
}
NUM_SPECIAL_TOKENS = 256


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
    self.ranks = ranks = _read_ranks(path)  # bytes -> rank (id), 0..base-1
    base = len(ranks)
    self.special_tokens = {
      KIMI_SPECIAL_TOKENS.get(i, f"<|reserved_token_{base + i}|>"): base + i
      for i in range(NUM_SPECIAL_TOKENS)
    }
    self.bos_id, self.eos_id = self.special_tokens["[BOS]"], self.special_tokens["[EOS]"]
    self.pad_id = self.special_tokens["[PAD]"]
    self.vocab_size = base + NUM_SPECIAL_TOKENS
    self._encoding = tiktoken.Encoding(
      name=os.path.basename(path),
      pat_str=KIMI_PATTERN,
      mergeable_ranks=ranks,
      special_tokens=self.special_tokens,
    )

  def encode(self, text: str) -> list[int]:
    # Raw corpora may contain the literal text "[EOS]"; it must stay plain text.
    return self._encoding.encode_ordinary(text)

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids`; the packing tokens BOS, EOS and PAD are dropped, other special tokens
    (e.g. <|im_end|>) decode to their names."""
    framing = (self.bos_id, self.eos_id, self.pad_id)
    return self._encoding.decode([int(i) for i in ids if int(i) not in framing])

  def encode_documents(self, documents: Sequence[bytes]) -> list[np.ndarray]:
    texts = [doc.decode("utf-8", errors="replace") for doc in documents]
    # tiktoken releases the GIL while encoding, so a thread per core helps.
    encoded = self._encoding.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)
    return [np.asarray(ids, dtype=np.int32) for ids in encoded]


def _read_ranks(path: str) -> dict[bytes, int]:
  """Parses a tiktoken file; ranks must be exactly 0..n-1 so the special ids follow them,
  and every single byte must be a token (byte-level BPE: any text encodes). An empty or
  truncated file is one ValueError naming it.

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
        cut = "" if line.endswith(b"\n") else " (the file may be truncated)"
        raise ValueError(
          f"{path}:{line_number}: expected 'base64_token rank', got {line[:60]!r}{cut}"
        ) from e
  if not ranks:
    raise ValueError(
      f"tokenizer file {path} is empty: a tiktoken file has one 'base64_token rank' line per token"
    )
  if sorted(ranks.values()) != list(range(len(ranks))):
    raise ValueError(f"{path}: ranks must be exactly 0..{len(ranks) - 1} with no gaps or repeats")
  missing = [i for i in range(256) if bytes([i]) not in ranks]
  if missing:
    raise ValueError(
      f"tokenizer file {path} lacks {len(missing)} of the 256 single-byte tokens (e.g. byte "
      f"{missing[0]:#04x}) in its {len(ranks)} ranks: truncated, or not a byte-level BPE file"
    )
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


def write_byte_ranks(path: str) -> str:
  """Writes a tiktoken file of the 256 single bytes and no merges (`vocab_size` 512 with Kimi's
  special tokens): a tokenizer for tiny CPU runs of the chat format. Returns `path`."""
  with open(path, "w") as f:
    f.write("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(256)))
  return path
