"""Tokenizer and generation files beside an exported checkpoint, for
`AutoTokenizer.from_pretrained(dir)` and `model.generate`: `tokenizer.json` (the `tokenizers`
library's format, written as plain JSON: no dependency), `tokenizer_config.json`,
`special_tokens_map.json` and `generation_config.json`.

Both of our tokenizers (`data.tokenizer`) become byte-level BPE in that format, id for id:

* `ByteTokenizer`: 256 single-byte tokens (id = byte value), no merges, then `<|bos|>` 256,
  `<|eos|>` 257, `<|pad|>` 258.
* `TiktokenTokenizer`: its ranks as the vocabulary, the merges recovered from the ranks (each
  token of two or more bytes is the merge of the two parts that byte-pair encoding with the
  lower ranks leaves of it), Kimi K2's pre-tokenization regex, its special tokens; the
  tiktoken file is copied too.
"""

from __future__ import annotations

import functools
import json
import os
import shutil

from composer_jax.data.tokenizer import (
  KIMI_PATTERN,
  TIKTOKEN_FILENAME,
  ByteTokenizer,
  TiktokenTokenizer,
)

BYTE_SPECIAL_TOKENS = {"<|bos|>": 256, "<|eos|>": 257, "<|pad|>": 258}
FILES = (
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "generation_config.json",
)


@functools.cache
def _byte_to_unicode() -> dict[int, str]:
  """GPT-2's printable stand-in for each byte (the `ByteLevel` pre-tokenizer's alphabet)."""
  printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[b] = chr(b)
    else:
      chars[b] = chr(256 + extra)
      extra += 1
  return chars


def _unicode(token: bytes) -> str:
  table = _byte_to_unicode()
  return "".join(table[b] for b in token)


def _merges(ranks: dict[bytes, int]) -> list[list[str]]:
  """The BPE merges that rebuild `ranks`' multi-byte tokens, in rank order."""
  merges = []
  for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
    if len(token) < 2:
      continue
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:  # merge the adjacent pair of lowest rank below `rank`
      pairs = [(ranks.get(a + b, rank), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
      best, i = min(pairs)
      if best >= rank:
        raise ValueError(f"token rank {rank} ({token!r}) is not reachable by merges")
      parts[i : i + 2] = [parts[i] + parts[i + 1]]
    merges.append([_unicode(parts[0]), _unicode(parts[1])])
  return merges


def _byte_level(use_regex: bool) -> dict:
  return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
          "use_regex": use_regex}  # fmt: skip


def _tokenizer_json(ranks: dict[bytes, int], special: dict[str, int], pattern: str | None) -> dict:
  pre = _byte_level(False)
  if pattern is not None:
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
             "invert": False}  # fmt: skip
    pre = {"type": "Sequence", "pretokenizers": [split, pre]}
  added = [
    {
      "id": i,
      "content": name,
      "single_word": False,
      "lstrip": False,
      "rstrip": False,
      "normalized": False,
      "special": True,
    }  # fmt: skip
    for name, i in sorted(special.items(), key=lambda kv: kv[1])
  ]
  return {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": added,
    "normalizer": None,
    "pre_tokenizer": pre,
    "post_processor": None,
    "decoder": _byte_level(True),
    "model": {
      "type": "BPE",
      "dropout": None,
      "unk_token": None,
      "continuing_subword_prefix": None,
      "end_of_word_suffix": None,
      "fuse_unk": False,
      "byte_fallback": False,
      "ignore_merges": False,
      "vocab": {_unicode(t): r for t, r in ranks.items()},
      "merges": _merges(ranks),
    },
  }


def write_tokenizer(tokenizer: ByteTokenizer | TiktokenTokenizer, out_dir: str) -> None:
  """Writes `FILES` for `tokenizer` into `out_dir` (and, for a tiktoken file, a copy of it)."""
  if isinstance(tokenizer, ByteTokenizer):
    ranks, special, pattern = {bytes([b]): b for b in range(256)}, BYTE_SPECIAL_TOKENS, None
  else:
    ranks, special, pattern = tokenizer.ranks, tokenizer.special_tokens, KIMI_PATTERN
    shutil.copyfile(tokenizer.path, os.path.join(out_dir, TIKTOKEN_FILENAME))
  name = {i: n for n, i in special.items()}
  bos, eos, pad = (name[tokenizer.bos_id], name[tokenizer.eos_id], name[tokenizer.pad_id])
  files = {
    "tokenizer.json": _tokenizer_json(ranks, special, pattern),
    "tokenizer_config.json": {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "bos_token": bos,
      "eos_token": eos,
      "pad_token": pad,
      "add_bos_token": False,
      "add_eos_token": False,
      "clean_up_tokenization_spaces": False,
      "model_max_length": 1 << 30,
    },
    "special_tokens_map.json": {"bos_token": bos, "eos_token": eos, "pad_token": pad},
    "generation_config.json": {
      "bos_token_id": tokenizer.bos_id,
      "eos_token_id": tokenizer.eos_id,
      "pad_token_id": tokenizer.pad_id,
      "do_sample": False,
    },
  }
  for filename, content in files.items():
    with open(os.path.join(out_dir, filename), "w") as f:
      json.dump(content, f, indent=1, ensure_ascii=False)
