"""A small BPE file for the chat tests: all 256 bytes plus merges the conversations use."""

import base64

import pytest
from ml_collections import ConfigDict

from composer_jax.data import tokenizer as tok_lib

# Merges in rank order; each one's halves exist at lower ranks (tiktoken merges pairs).
_MERGES = [
  b"th",
  b"in",
  b"re",
  b"an",
  b" t",
  b" th",
  b"on",
  b"er",
  b"fi",
  b"le",
  b"file",
  b"ea",
  b"rea",
  b"read",
  b"_f",
  b"_file",
  b"read_file",
  b"ed",
  b"it",
  b"edit",
  b"un",
  b"fun",
  b"ct",
  b"ion",
  b"ction",
  b"func",
  b"function",
  b"functions",
  b"  ",
  b"    ",
  b"\n\n",
  b"()",
  b'":',
  b'",',
  b'{"',
  b"py",
  b".py",
]


def build_bpe(path) -> str:
  """Writes `base64(token) rank` lines: the 256 bytes, then `_MERGES` (skipping merges
  whose halves are not yet tokens, so every merge is reachable)."""
  ranks = {bytes([i]): i for i in range(256)}
  for token in _MERGES:
    if token not in ranks and any(
      token[:k] in ranks and token[k:] in ranks for k in range(1, len(token))
    ):
      ranks[token] = len(ranks)
  path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
  return str(path)


@pytest.fixture
def bpe_path(tmp_path):
  return build_bpe(tmp_path / "tiktoken.model")


@pytest.fixture
def chat_tokenizer(bpe_path):
  return tok_lib.load_tokenizer(ConfigDict({"tokenizer": bpe_path}))
