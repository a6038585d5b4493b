"""The report's scenario in the tool env: long episodes, the verbose answer (second behaviour),
the full-list hint in the warm-up, and the held-out probe contexts of both behaviours."""

import numpy as np
import pytest

from composer_jax.envs.toolcall import probe_contexts
from composer_jax.envs.toolcall.env import TOOL_CAPABILITY, ToolEnv, ToolTask
from composer_jax.envs.toolcall.feedback import FEEDBACK_KINDS, SHORT_HINT
from composer_jax.envs.toolcall.vocab import Vocab
from composer_jax.envs.toolcall.warmup import scripted_turns
from composer_jax.rl.feedback import make_feedback
from composer_jax.rl.trajectory import Trajectory, Turn

VOCAB = Vocab()


def _play(env, task, turns):
  state, _ = env.reset(task)
  for words in turns:
    state, _ = env.step(state, VOCAB.encode(words))
  return state


def test_long_tasks_need_every_listed_call_and_an_unavailable_call_costs_nothing():
  env = ToolEnv(VOCAB, calls_per_task=12, max_model_turns=20)
  task = env.sample_task(np.random.default_rng(0))
  assert len(task.required) == 12 and len(set(task.required)) < 12  # repeats
  t = ToolTask(("forecast", "mail"), ("temperature", "message", "temperature"))
  calls = ["call forecast <eot>", "call mail <eot>"]
  assert env.reward(_play(env, t, calls + ["answer <eot>"])) == 0.0  # one temperature short
  full = _play(env, t, ["call weather <eot>", *calls, "call forecast <eot>", "answer <eot>"])
  assert env.reward(full) == 1.0 and full.unavailable_calls == 1
  with pytest.raises(ValueError, match="max_model_turns=12 must be > calls_per_task=12"):
    ToolEnv(VOCAB, calls_per_task=12, max_model_turns=12)


def test_verbose_answer_parses_counts_and_is_flagged():
  env = ToolEnv(VOCAB, feedback_kinds=("overlong_message",))
  t = ToolTask(("forecast",), ("temperature",))
  assert env.parse(VOCAB.encode("answer result temperature <eot>")) == ("answer", "verbose")
  assert env.parse(VOCAB.encode("answer result forecast <eot>"))[0] == "bad_format"
  verbose = _play(env, t, ["call forecast <eot>", "answer result temperature <eot>"])
  short = _play(env, t, ["call forecast <eot>", "answer <eot>"])
  assert env.reward(verbose) == env.reward(short) == 1.0  # the style costs no reward
  assert verbose.verbose_answer and not short.verbose_answer
  ep = type("Episode", (), {})()  # the feedback reads only `trajectory` and `task`
  (flag,) = make_feedback(FEEDBACK_KINDS, ["overlong_message"])
  ep.trajectory = Trajectory.from_turns(
    [Turn([1]), Turn(VOCAB.encode("answer result temperature <eot>"), [0.0] * 4)], 1.0, 0
  )
  assert flag(env, ep) == [(1, VOCAB.encode(SHORT_HINT))]


def test_warmup_full_list_hint_and_verbose_answers():
  env = ToolEnv(VOCAB)
  rng = np.random.default_rng(0)
  hints, verbose, short_hinted, answers = set(), 0, 0, 0
  for _ in range(200):
    task = env.sample_task(rng)
    turns = scripted_turns(env, task, rng, 0.5, hint_all_tools=True, verbose_prob=0.5)
    words = [" ".join(VOCAB.decode(t.tokens)) for t in turns]
    hints |= {w for w in words if w.startswith("reminder: available")}
    for prev, w in zip(words, words[1:], strict=False):
      if w.startswith("answer"):
        answers += 1
        verbose += w.startswith("answer result")
        short_hinted += prev == SHORT_HINT
        assert not (prev == SHORT_HINT and w != "answer <eot>")
  # Full lists: as long as the offered tools (>= 3), never the targeted single alias.
  assert hints and all(len(h.split()) >= 6 for h in hints)
  assert 0.35 < short_hinted / answers < 0.65 and 0.15 < verbose / answers < 0.35


@pytest.mark.parametrize(
  "behaviour, bad, good",
  [("unavailable_tool", None, None), ("overlong_message", "result", "<eot>")],
)
def test_probe_contexts(behaviour, bad, good):
  env = ToolEnv(VOCAB, max_required=3)
  ps = probe_contexts.probe_set(
    env,
    np.random.default_rng(5),
    6,
    seq_len=64,
    teacher_seq_len=64,
    turn_len=6,
    behaviour=behaviour,
    all_tools=True,
  )
  tb = ps["teacher_batch"]
  rows = np.arange(6)
  bad_ids = tb["slot_target"][rows, tb["probe_slot"]]
  words = lambda ids: [VOCAB.words[i] for i in ids]
  if bad is None:  # the unavailable alias; good is the offered one of the same capability
    for b, g in zip(words(bad_ids), words(tb["good_id"]), strict=True):
      assert b != g and TOOL_CAPABILITY[b] == TOOL_CAPABILITY[g]
  else:
    assert set(words(bad_ids)) == {bad} and set(words(tb["good_id"])) == {good}
  with pytest.raises(ValueError, match="behaviour='typo'"):
    probe_contexts.probe_set(
      env, np.random.default_rng(5), 1, seq_len=64, teacher_seq_len=64, turn_len=6, behaviour="typo"
    )
