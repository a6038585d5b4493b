"""Shared fixtures for the data tests: hand-written tiktoken files."""

import base64

import pytest


def _write_tiktoken(path, merges):
  """Writes a tiktoken file (`base64(token) rank` per line): all 256 bytes, then `merges`."""
  ranks = {bytes([i]): i for i in range(256)} | merges
  lines = [f"{base64.b64encode(tok).decode()} {rank}" for tok, rank in ranks.items()]
  path.write_text("\n".join(lines) + "\n")
  return str(path)


@pytest.fixture
def write_tiktoken():
  return _write_tiktoken


@pytest.fixture
def tiny_tiktoken(tmp_path):
  """tmp_path/tiktoken.model whose merges give "hello" -> [258 'hell', 111 'o']."""
  return _write_tiktoken(tmp_path / "tiktoken.model", {b"he": 256, b"ll": 257, b"hell": 258})
