"""A tool-calling environment: a random subset of tools on offer, a task that needs some of them.

Episode, as word tokens (`vocab.py`):

    env    <bos> tools: forecast stocks mail task: temperature message <eot>
    model  call weather <eot>                  # `weather` is not on offer
    env    error weather not_found <eot>       # the episode continues
    model  call forecast <eot>
    env    result temperature <eot>
    model  call mail <eot>
    env    result message <eot>
    model  answer <eot>                        # ends the episode

Each episode (`sample_task`, seeded by a numpy Generator) offers one alias for each of a random
subset of capabilities (the first alias of a pair with probability `first_alias_prob`: a
deployment whose tool set differs from the one the model saw in training), in random order, and
asks for 1..max_required of those capabilities. Long episodes (`calls_per_task` n > 0, the
report's scenario): the task is a list of n capabilities drawn with repeats from the offered
ones, each occurrence needing its own call, so an episode holds tens of tool calls. A model turn
is `call TOOL <eot>`, `answer <eot>`, or the verbose answer `answer result CAP... <eot>` (a
summary of what was obtained, the form the `overlong_message` feedback flags); anything else
gets `error bad_format <eot>`. The episode ends at an answer or after `max_model_turns` model
turns. Reward (task success): 1 if the model answered after obtaining every required capability
(as many times as the task lists it), else 0. A call to an unavailable tool costs a turn, so it
lowers the reward only when the turn budget runs out: the reward says that something went
wrong, not where; with a budget well above the task's calls it costs (almost) nothing, and the
verbose answer never costs anything.

`ToolEnv` implements the RL environment protocol `composer_jax.rl.env.Env`: besides tasks,
turns and rewards it flags faulty model turns with the feedback kinds it was built with
(`feedback.py`) and reports episode metrics (reward, unavailable-call rate, calls and turns).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import numpy as np

from composer_jax.envs.toolcall import feedback as feedback_lib
from composer_jax.envs.toolcall import probe_contexts
from composer_jax.envs.toolcall import vocab as vocab_lib
from composer_jax.rl import feedback as rl_feedback

TOOL_CAPABILITY = {t: c for c, pair in vocab_lib.CAPABILITIES.items() for t in pair}


@dataclasses.dataclass(frozen=True)
class ToolTask:
  """available: the tools offered, in the order shown; required: capability words asked for."""

  available: tuple[str, ...]
  required: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class EpisodeState:
  """What the environment tracks of one episode."""

  task: ToolTask
  obtained: tuple[str, ...] = ()
  calls: int = 0
  unavailable_calls: int = 0
  verbose_answer: bool = False
  model_turns: int = 0
  answered: bool = False
  done: bool = False


class ToolEnv:
  """Tasks, replies, rewards and feedback of the tool-calling environment (module docstring).

  `feedback_kinds` / `feedback_options`: the kinds of `feedback.FEEDBACK_KINDS` that
  `feedback(episode)` runs, and their options.
  """

  def __init__(
    self,
    vocab: vocab_lib.Vocab,
    *,
    min_tools: int = 3,
    max_tools: int = 6,
    max_required: int = 3,
    max_model_turns: int = 4,
    first_alias_prob: float = 0.5,
    calls_per_task: int = 0,
    feedback_kinds: Sequence[str] = ("unavailable_tool",),
    feedback_options: dict[str, dict] | None = None,
  ):
    n = len(vocab_lib.CAPABILITIES)
    if not 1 <= min_tools <= max_tools <= n:
      raise ValueError(f"need 1 <= min_tools={min_tools} <= max_tools={max_tools} <= {n}")
    if not 1 <= max_required <= min_tools:
      raise ValueError(f"max_required={max_required} must be in [1, min_tools={min_tools}]")
    if max_model_turns < 2:
      raise ValueError(f"max_model_turns={max_model_turns} must be >= 2 (a call and an answer)")
    if not 0.0 <= first_alias_prob <= 1.0:
      raise ValueError(f"first_alias_prob={first_alias_prob} must be in [0, 1]")
    if calls_per_task < 0:
      raise ValueError(f"calls_per_task={calls_per_task} must be >= 0 (0: distinct capabilities)")
    if calls_per_task and max_model_turns <= calls_per_task:
      raise ValueError(
        f"max_model_turns={max_model_turns} must be > calls_per_task="
        f"{calls_per_task} (the calls and the answer)"
      )
    self.first_alias_prob, self.calls_per_task = first_alias_prob, calls_per_task
    self.vocab = vocab
    self.min_tools, self.max_tools = min_tools, max_tools
    self.max_required, self.max_model_turns = max_required, max_model_turns
    self._call, self._answer, self._result = vocab.encode("call answer result")
    self._feedbacks = rl_feedback.make_feedback(
      feedback_lib.FEEDBACK_KINDS, feedback_kinds, feedback_options
    )
    self._feedback_kinds, self._feedback_options = tuple(feedback_kinds), feedback_options or {}
    self.pad_id, self.stop_ids = vocab.pad_id, (vocab.eot_id,)

  def sample_task(self, rng: np.random.Generator) -> ToolTask:
    caps = list(vocab_lib.CAPABILITIES)
    offered = rng.choice(len(caps), rng.integers(self.min_tools, self.max_tools + 1), replace=False)
    second = rng.random(len(offered)) >= self.first_alias_prob
    available = tuple(vocab_lib.CAPABILITIES[caps[i]][int(s)] for i, s in zip(offered, second))
    if self.calls_per_task:
      required = rng.choice(offered, self.calls_per_task, replace=True)
    else:
      required = rng.choice(offered, rng.integers(1, self.max_required + 1), replace=False)
    return ToolTask(available, tuple(caps[i] for i in required))

  def reset(self, task: ToolTask) -> tuple[EpisodeState, list[int]]:
    """The initial state and the first (system) turn's tokens."""
    words = ["<bos>", "tools:", *task.available, "task:", *task.required, "<eot>"]
    return EpisodeState(task), self.vocab.encode(words)

  def parse(self, tokens: Sequence[int]) -> tuple[str, str | None]:
    """A model turn -> ('call', tool) | ('answer', None) | ('answer', 'verbose') |
    ('bad_format', None)."""
    t, eot = [int(i) for i in tokens], self.vocab.eot_id
    # The model's vocabulary may be larger than the environment's: unknown ids are bad format.
    if len(t) == 3 and t[0] == self._call and t[2] == eot and 0 <= t[1] < self.vocab.size:
      tool = self.vocab.words[t[1]]
      if tool in TOOL_CAPABILITY:
        return "call", tool
    if t == [self._answer, eot]:
      return "answer", None
    if (
      len(t) >= 4
      and t[:2] == [self._answer, self._result]
      and t[-1] == eot
      and all(
        0 <= i < self.vocab.size and self.vocab.words[i] in vocab_lib.CAPABILITIES for i in t[2:-1]
      )
    ):
      return "answer", "verbose"
    return "bad_format", None

  def step(self, state: EpisodeState, tokens: Sequence[int]) -> tuple[EpisodeState, list[int]]:
    """Applies one model turn; returns the new state and the reply ([] once the episode is done)."""
    if state.done:
      raise ValueError("step() on a finished episode")
    kind, tool = self.parse(tokens)
    s = dataclasses.replace(state, model_turns=state.model_turns + 1)
    if kind == "answer":
      return dataclasses.replace(s, answered=True, done=True, verbose_answer=tool == "verbose"), []
    if kind == "call" and tool in state.task.available:
      cap = TOOL_CAPABILITY[tool]
      s = dataclasses.replace(s, calls=s.calls + 1, obtained=s.obtained + (cap,))
      reply = ["result", cap, "<eot>"]
    elif kind == "call":
      s = dataclasses.replace(s, calls=s.calls + 1, unavailable_calls=s.unavailable_calls + 1)
      reply = ["error", tool, "not_found", "<eot>"]
    else:
      reply = ["error", "bad_format", "<eot>"]
    if s.model_turns >= self.max_model_turns:
      return dataclasses.replace(s, done=True), []
    return s, self.vocab.encode(reply)

  def reward(self, state: EpisodeState) -> float:
    """Task success: answered, with every required capability obtained (as often as listed)."""
    need, got = Counter(state.task.required), Counter(state.obtained)
    return float(state.answered and all(got[c] >= n for c, n in need.items()))

  def hint(self, task: ToolTask, tool: str | None = None) -> list[int]:
    """The reminder 'reminder: available <tools> <eot>' for a call to `tool`: the offered tools
    that serve `tool`'s capability (the targeted hint), or every offered tool if `tool` is None.
    """
    tools = task.available
    if tool is not None:
      if tool not in TOOL_CAPABILITY:
        raise ValueError(f"unknown tool {tool!r}; valid: {sorted(TOOL_CAPABILITY)}")
      tools = [t for t in tools if TOOL_CAPABILITY[t] == TOOL_CAPABILITY[tool]]
    return self.vocab.encode(["reminder:", "available", *tools, "<eot>"])

  def probe_set(
    self, rng: np.random.Generator, count: int, *, seq_len: int, teacher_seq_len: int, turn_len: int
  ) -> dict:
    """Held-out probe contexts (`envs.toolcall.probe_contexts`) of this env's first feedback kind, with the
    hint that kind gives (the full tool list when its option `all_tools` is set)."""
    kind = self._feedback_kinds[0]
    all_tools = bool(self._feedback_options.get(kind, {}).get("all_tools", False))
    return probe_contexts.probe_set(
      self,
      rng,
      count,
      seq_len=seq_len,
      teacher_seq_len=teacher_seq_len,
      turn_len=turn_len,
      behaviour=kind,
      all_tools=all_tools,
    )

  def feedback(self, episode) -> list[tuple[int, list[int]]]:
    """(turn index, hint ids) of each model turn flagged by this environment's feedback kinds."""
    return rl_feedback.flag_turns(self._feedbacks, self, episode)

  def episode_metrics(self, episodes) -> dict[str, float]:
    """Task reward, the rate of calls to unavailable tools and of verbose answers (over
    answered episodes) over a batch of episodes."""
    states = [e.state for e in episodes]
    calls, answered = sum(s.calls for s in states), sum(s.answered for s in states)
    return dict(
      reward=float(np.mean([e.trajectory.reward for e in episodes])),
      unavailable_rate=sum(s.unavailable_calls for s in states) / max(calls, 1),
      verbose_rate=sum(s.verbose_answer for s in states) / max(answered, 1),
      calls_per_episode=calls / len(states),
      model_turns_per_episode=float(np.mean([s.model_turns for s in states])),
    )
