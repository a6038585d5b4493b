"""The word-level vocabulary of the tool-calling environment.

One id per word, so a tool call is three tokens (`call weather <eot>`) and a whole episode fits
in ~50 tokens: the `tiny` model learns the format in a few hundred warm-up steps on CPU. Id 0 is
padding, 1 begins a stream, 2 ends every turn (the sampler's stop id).

Tools come in alias pairs that serve the same capability (`weather` / `forecast` both give a
`temperature`); an episode offers one alias per capability, so calling the wrong alias of a
needed capability is a call to an unavailable tool.
"""

from __future__ import annotations

from collections.abc import Sequence

PAD, BOS, EOT = "<pad>", "<bos>", "<eot>"
# capability word (what a task asks for) -> the two tools that provide it.
CAPABILITIES = {
  "temperature": ("weather", "forecast"),
  "price": ("stocks", "market"),
  "message": ("email", "mail"),
  "route": ("maps", "directions"),
  "sum": ("calculator", "compute"),
  "fact": ("search", "lookup"),
}
KEYWORDS = (
  "tools:",
  "task:",
  "call",
  "answer",
  "result",
  "error",
  "not_found",
  "bad_format",
  "reminder:",
  "available",
  "keep",
  "messages",
  "short",
)
TOOLS = tuple(t for pair in CAPABILITIES.values() for t in pair)
WORDS = (PAD, BOS, EOT, *KEYWORDS, *CAPABILITIES, *TOOLS)


class Vocab:
  """Word <-> id. `encode` takes words (a space-separated string or a sequence)."""

  def __init__(self, words: Sequence[str] = WORDS):
    if len(set(words)) != len(words):
      raise ValueError(f"duplicate words in vocabulary: {sorted(words)}")
    self.words = tuple(words)
    self.ids = {w: i for i, w in enumerate(self.words)}
    self.pad_id, self.bos_id, self.eot_id = self.ids[PAD], self.ids[BOS], self.ids[EOT]

  @property
  def size(self) -> int:
    return len(self.words)

  def encode(self, words: str | Sequence[str]) -> list[int]:
    words = words.split() if isinstance(words, str) else words
    unknown = [w for w in words if w not in self.ids]
    if unknown:
      raise ValueError(f"words {unknown} are not in the vocabulary; valid: {self.words}")
    return [self.ids[w] for w in words]

  def decode(self, ids: Sequence[int]) -> list[str]:
    bad = [int(i) for i in ids if not 0 <= int(i) < self.size]
    if bad:
      raise ValueError(f"ids {bad} outside the vocabulary [0, {self.size})")
    return [self.words[int(i)] for i in ids]
