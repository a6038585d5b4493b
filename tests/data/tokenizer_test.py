"""Tokenizers against hand-computed ids."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from ml_collections import ConfigDict

from composer_jax.data import tokenizer as tok_lib


def test_byte_tokenizer_matches_utf8():
  tok = tok_lib.load_tokenizer(ConfigDict({"tokenizer": "byte"}))
  text = "def f():\n  return 'é中'"
  assert tok.encode(text) == list(text.encode("utf-8"))
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (256, 257, 258, 259)
  assert tok.decode([tok.bos_id, *tok.encode(text), tok.eos_id, tok.pad_id]) == text
  (doc,) = tok.encode_documents([text.encode()])
  np.testing.assert_array_equal(doc, list(text.encode("utf-8")))


@pytest.mark.parametrize(
  "text, expected",
  [
    ("hello", [258, 111]),  # he + ll -> hell, then o.
    ("hello hello", [258, 111, 32, 258, 111]),  # The space starts the second word's piece.
    ("a1234", [97, 49, 50, 51, 52]),  # Letters and digits are separate pieces: no 'a1' merge.
    ("1234", [49, 50, 51, 52]),  # Digits split 3 + 1, so the '34' merge cannot apply.
  ],
)
def test_tiktoken_file_encodes_by_hand(tmp_path, write_tiktoken, text, expected):
  path = write_tiktoken(
    tmp_path / "tiktoken.model", {b"he": 256, b"ll": 257, b"hell": 258, b"a1": 259, b"34": 260}
  )
  tok = tok_lib.load_tokenizer(ConfigDict({"tokenizer": path}))
  assert tok.encode(text) == expected
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (261, 262, 516, 517)
  assert tok.decode([tok.bos_id, *expected, tok.eos_id]) == text
  (doc,) = tok.encode_documents([text.encode()])
  np.testing.assert_array_equal(doc, expected)


def test_kimi_special_token_ids(tmp_path, write_tiktoken, monkeypatch):
  """A tiktoken file of Kimi's size (163,584 ranks) gets the ids of the released K2.5
  tokenizer_config.json (`added_tokens_decoder`, stored in kimi_k25_added_tokens.json)."""
  # The ranks' content is irrelevant to the ids: a small file, then a 163,584-rank count.
  real = tok_lib._read_ranks
  monkeypatch.setattr(
    tok_lib,
    "_read_ranks",
    lambda p: {**real(p), **{f"t{i}".encode(): i for i in range(256, 163584)}},
  )
  tok = tok_lib.TiktokenTokenizer(write_tiktoken(tmp_path / "tiktoken.model", {}))
  released = json.loads((Path(__file__).parent / "kimi_k25_added_tokens.json").read_text())
  published = {name: int(i) for i, name in released["added_tokens_decoder"].items()}
  assert published["<think>"] == 163606 and len(published) == 23
  assert {k: tok.special_tokens[k] for k in published} == published
  assert tok.special_tokens["<|reserved_token_163589|>"] == 163589
  assert len(tok.special_tokens) == 256
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (163584, 163585, 163839, 163840)
  hi = tok.encode("hi")
  ids = [tok.bos_id, 163587, *hi, 163586, tok.eos_id, tok.pad_id]
  assert tok.decode(ids) == "<|im_user|>hi<|im_end|>"  # <|im_end|> is kept
  assert tok.encode("<|im_end|>") != [163586]  # literal text in a corpus stays text


def test_tokenizer_found_next_to_checkpoint(tmp_path, tiny_tiktoken):
  assert tok_lib.find_tokenizer_near(str(tmp_path)) == tiny_tiktoken
  tok = tok_lib.load_tokenizer(ConfigDict({"tokenizer": str(tmp_path)}))
  assert tok.encode("hello") == [258, 111]
  assert tok_lib.find_tokenizer_near(str(tmp_path / "elsewhere")) is None


def test_changed_file_is_reloaded(tmp_path, tiny_tiktoken, write_tiktoken):
  cfg = ConfigDict({"tokenizer": tiny_tiktoken})
  assert tok_lib.load_tokenizer(cfg).encode("hello") == [258, 111]
  write_tiktoken(tmp_path / "tiktoken.model", {})
  os.utime(tiny_tiktoken, ns=(1, 1))  # A distinct mtime even on coarse-clock filesystems.
  assert tok_lib.load_tokenizer(cfg).encode("hello") == list(b"hello")


@pytest.mark.parametrize(
  "content, match",
  [
    ("aGU= 0\nnot-a-line\n", "expected 'base64_token rank'"),
    ("aGU= 0\nbGw= 2\n", "ranks must be exactly 0..1"),
    ("", r"tokenizer file .*bad.model is empty"),
    ("\n\n", r"tokenizer file .*bad.model is empty"),
    ("aGU= 0\nbGw", r"bad.model:2: expected .* \(the file may be truncated\)"),
    # Cut at a line end: its ranks are consistent, but most single bytes are gone.
    ("AA== 0\nAQ== 1\n", r"bad.model lacks 254 of the 256 single-byte tokens \(e.g. byte 0x02\)"),
  ],
)
def test_bad_tiktoken_file(tmp_path, content, match):
  path = tmp_path / "bad.model"
  path.write_text(content)
  with pytest.raises(ValueError, match=match):
    tok_lib.load_tokenizer(ConfigDict({"tokenizer": str(path)}))


@pytest.mark.parametrize("name", ["missing.model", "no_model_dir"])
def test_missing_tokenizer_path(tmp_path, name):
  (tmp_path / "no_model_dir").mkdir()
  with pytest.raises(ValueError, match=name):
    tok_lib.load_tokenizer(ConfigDict({"tokenizer": str(tmp_path / name)}))
