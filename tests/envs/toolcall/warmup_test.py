"""Tests for the scripted warm-up data."""

import numpy as np
import pytest

from composer_jax.envs.toolcall.env import ToolEnv
from composer_jax.envs.toolcall.vocab import TOOLS, Vocab
from composer_jax.envs.toolcall.warmup import scripted_turns, warmup_batches

VOCAB = Vocab()
ENV = ToolEnv(VOCAB)


def test_hinted_calls_use_offered_tools_and_episodes_succeed_within_budget():
  rng = np.random.default_rng(0)
  hinted = unhinted_wrong = unhinted = 0
  for _ in range(300):
    task = ENV.sample_task(rng)
    turns = scripted_turns(ENV, task, rng, hint_prob=0.5)
    state, _ = ENV.reset(task)
    for prev, turn in zip(turns, turns[1:], strict=False):
      if turn.logprobs is None:
        continue
      kind, tool = ENV.parse(turn.tokens)
      state, _ = ENV.step(state, turn.tokens)
      if kind != "call":
        continue
      if list(prev.tokens) == ENV.hint(task, tool):
        hinted += 1
        assert tool in task.available
      elif VOCAB.decode(prev.tokens)[0] != "error":  # a first attempt without hint
        unhinted += 1
        unhinted_wrong += tool not in task.available
    # Failures only come from running out of turns after not_found errors.
    assert ENV.reward(state) == 1.0 or state.unavailable_calls > 0
  assert hinted > 100 and 0.35 < unhinted_wrong / unhinted < 0.65


def test_batch_loss_mask_is_model_tokens():
  batch = next(
    warmup_batches(ENV, np.random.default_rng(1), batch_size=8, seq_len=64, hint_prob=0.3)
  )
  assert batch["tokens"].shape == (8, 64)
  words = np.array(VOCAB.words)[batch["targets"]]
  mask = batch["loss_mask"] > 0
  assert set(words[mask]) <= {"call", "answer", "<eot>", *TOOLS}
  assert not set(words[mask]) & {"result", "error", "tools:", "reminder:"}
  with pytest.raises(ValueError, match="hint_prob=1.5"):
    warmup_batches(ENV, np.random.default_rng(1), batch_size=2, seq_len=64, hint_prob=1.5)
