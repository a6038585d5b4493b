"""`CodingEnv`: coding-task episodes as an RL environment (`rl.env.Env`), Kimi K2.5 chat format.

Episode, token-in/token-out (`composer_jax.chat`; `<|gen|>` = the generation prompt
`<|im_assistant|>assistant<|im_middle|><think>`, K2.5's thinking pre-fill; in instant mode,
`thinking=False`, `<|im_assistant|>assistant<|im_middle|><think></think>`):

    env    [tool_declare: tool declarations][system: SYSTEM][user: task statement]<|gen|>
    model  ...</think>text<|tool_calls_section_begin|>...calls...<|tool_calls_section_end|><|im_end|>
    env    [tool: ## Return of functions.NAME:IDX + observation] per call ...<|gen|>
    ...

A model turn stops at `<|im_end|>`. Its text, after the pre-fill, is parsed
(`chat.parse_assistant`, never raises); the calls go to the harness (`agent_tools.Session`, through `agent_episode.act`) and
each observation comes back as a tool message; a turn that does not parse gets a system
message with the parse error and runs no call. The episode ends at `submit`, at a turn without
calls, or when a budget runs out (turns, wall time, or tokens: the history plus the next turn's
`max_turn_tokens` must fit `budget.max_tokens`, so a sampler with that prompt length never
overflows). The reward is judged inside the last step (`agent_episode.judge`: trajectory
monitor, critical flag -> 0, else the grader on the workspace diff).

Feedback (`feedback(episode)`): the kinds of `agent_feedback.FEEDBACK_KINDS` the env was built
with flag model turns; a hint is rendered as `<|im_end|>` (closing the empty assistant message
the reply opened) + a system message + `<|gen|>`, so the teacher reads it as a system message
right before the turn it judges.

`step_many` steps many episodes at once on a worker pool (`workers.Pool`, local processes or
Ray; `with env:` keeps the workers up between steps); `rl.episodes.run_episodes` uses it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import time
from collections.abc import Callable, Sequence

import numpy as np
from absl import logging

from composer_jax import chat
from composer_jax.codetasks import workers as workers_lib
from composer_jax.codetasks.sandbox import bwrap
from composer_jax.codetasks.synthesis import curriculum as curriculum_lib
from composer_jax.codetasks.task import Task
from composer_jax.envs.coding.agent import episode as agent_episode
from composer_jax.envs.coding.agent import feedback as agent_feedback
from composer_jax.envs.coding.agent import tools as agent_tools
from composer_jax.rl import feedback as feedback_lib

STATEMENTS = ("full", "compact")
_CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
SYSTEM = (
  "You are a coding agent. The repository is checked out at /ws. Use the tools to read, "
  "search, edit and run it; call submit when the task is done."
)


@dataclasses.dataclass
class TurnRecord:
  """One model turn: trajectory turn index, tokens, text, parse error, calls."""

  index: int
  tokens: int
  text: str
  parse_error: str | None
  calls: list[agent_episode.Call]


@dataclasses.dataclass
class CodingState:
  """An episode in progress: the harness session, the model turns so far, the judgement."""

  session: agent_tools.Session
  records: list[TurnRecord] = dataclasses.field(default_factory=list)
  history: int = 0  # tokens so far
  done: bool = False
  end: str = ""
  reward: float = 0.0
  grade: dict | None = None
  flags: list[dict] = dataclasses.field(default_factory=list)
  grading_s: float = 0.0
  grade_cached: bool = False

  @property
  def task(self) -> Task:
    return self.session.task


class CodingEnv:
  """Coding episodes over `tasks` (module docstring).

  Args:
    tasks: the tasks `sample_task` draws from (uniformly, or the curriculum's active ones).
    tokenizer: a tiktoken tokenizer with Kimi's special tokens (`data.tokenizer`).
    budget: turns, tokens, wall time, observation length, command limits (`agent_tools`).
    tools: the tools offered (names of `agent_tools.TOOLS`).
    max_turn_tokens: the longest model turn the sampler writes (`rl.max_new_tokens`).
    feedback_kinds / feedback_options: the kinds of `agent_feedback.FEEDBACK_KINDS` run by
      `feedback`, and their options.
    workers / backend: the pool `step_many` uses (1: in this process).
    grade_limits: sandbox limits of the grader's test runs.
    curriculum: None (every task stays in play), or `curriculum.TaskPool` options
      (min_rollouts, easy_rate, max_active): `episode_metrics` records each episode's reward
      as its task's rollout, then retires never / always solved tasks, admits waiting ones and
      asks `harder` for variants of easy ones (`TaskPool.refresh`); logged and in the metrics.
    harder: task -> harder variants (e.g. `generator.Generator.harder`), for the curriculum.
    max_hint_tokens: the longest hint (`hint`): longer texts are cut, so a teacher row is at
      most the history + max_hint_tokens + the turn.
    thinking: K2.5's thinking mode (the turn opens with reasoning) or, False, instant mode.
    statement: the user message: 'full' (the task's problem statement) or 'compact' (only its
      code block, e.g. a deleted function's signature, docstring and path: short prompts for
      small models; the full text when it has none).
  """

  def __init__(
    self,
    tasks: Sequence[Task],
    tokenizer,
    *,
    budget: agent_tools.Budget = agent_tools.DEFAULT_BUDGET,
    tools: Sequence[str] = agent_tools.TOOL_NAMES,
    max_turn_tokens: int = 1024,
    feedback_kinds: Sequence[str] = ("unavailable_tool", "malformed_call"),
    feedback_options: dict[str, dict] | None = None,
    workers: int = 1,
    backend: str = "local",
    grade_limits: bwrap.Limits = bwrap.DEFAULT_LIMITS,
    system: str = SYSTEM,
    curriculum: dict | None = None,
    harder: Callable[[Task], list[Task]] | None = None,
    max_hint_tokens: int = 512,
    thinking: bool = True,
    statement: str = "full",
  ):
    if statement not in STATEMENTS:
      raise ValueError(f"statement={statement!r}; valid: {STATEMENTS}")
    self.statement = statement
    if not tasks:
      raise ValueError("CodingEnv needs at least one task")
    self.tasks = {t.id: t for t in tasks}
    self.pool = None if curriculum is None else curriculum_lib.TaskPool(list(tasks), **curriculum)
    self.harder, self.added = harder, set()
    self.tokenizer, self.budget, self.tools = tokenizer, budget, tuple(tools)
    agent_tools.Session.check_tools(self.tools)
    declared = [t for t in agent_tools.TOOLS if t["function"]["name"] in self.tools]
    self.prefix = chat.render_conversation(
      tokenizer, [chat.Message("system", system)], tools=declared
    ).ids.tolist()
    self.gen = chat.render_generation_prompt(tokenizer, thinking).ids.tolist()
    self.prefill = chat.prefill(thinking)
    self.stop_ids = (tokenizer.special_tokens["<|im_end|>"],)
    self.pad_id = tokenizer.pad_id
    self.max_turn_tokens = max_turn_tokens
    longest = max(tasks, key=self.prompt_tokens)
    n = self.prompt_tokens(longest)
    need = n + max_turn_tokens
    if max_turn_tokens < 1 or need > budget.max_tokens:
      raise ValueError(
        f"task {longest.id}'s first prompt is {n} tokens (tool declarations and system "
        f"{len(self.prefix)}, statement and generation prompt {n - len(self.prefix)}): with "
        f"max_turn_tokens="
        f"{max_turn_tokens} (>= 1) the episode budget max_tokens={budget.max_tokens} must be "
        f">= {need}"
      )
    if max_hint_tokens < len(self._hint("...")) + 8:
      raise ValueError(
        f"max_hint_tokens={max_hint_tokens} must be >= "
        f"{len(self._hint('...')) + 8} (a hint message's frame + 8 tokens)"
      )
    self.max_hint_tokens = max_hint_tokens
    self.grade_limits = grade_limits
    self._feedbacks = feedback_lib.make_feedback(
      agent_feedback.FEEDBACK_KINDS, feedback_kinds, feedback_options
    )
    self.workers = workers_lib.Pool(workers, backend)
    self.episode_log = ""  # a JSONL path: episode_metrics appends each batch's tasks there
    self._env_s = 0.0  # wall time in tool calls and judging since the last episode_metrics

  # -- worker pool lifetime ------------------------------------------------------------------
  def __enter__(self):
    self.workers.__enter__()
    return self

  def __exit__(self, *exc):
    self.workers.__exit__(*exc)

  # -- tasks ---------------------------------------------------------------------------------
  def active(self) -> list[str]:
    """The task ids `sample_task` draws from: the curriculum's active set, or all tasks (also
    once the curriculum has retired every task: the run goes on, as logged)."""
    ids = self.pool.active() if self.pool is not None else []
    return ids or sorted(self.tasks)

  def sample_task(self, rng: np.random.Generator) -> Task:
    ids = self.active()
    return self.tasks[ids[int(rng.integers(len(ids)))]]

  def state_dict(self) -> dict:
    """What a checkpoint keeps of the env (JSON-able): the curriculum's statistics and the
    tasks `harder` added during the run."""
    if self.pool is None:
      return {}
    added = [json.loads(self.tasks[t].to_json()) for t in sorted(self.tasks) if t in self.added]
    return {"curriculum": self.pool.state_dict(), "added": added}

  def load_state_dict(self, blob: dict) -> None:
    if self.pool is None or not blob:
      return
    for record in blob["added"]:
      t = Task(**record)
      self.tasks[t.id] = self.pool.tasks[t.id] = t
      self.pool.stats.setdefault(t.id, curriculum_lib.Stats())
      self.added.add(t.id)
    self.pool.load_state_dict(blob["curriculum"])

  # -- episodes ------------------------------------------------------------------------------
  def prompt(self, task: Task) -> list[int]:
    """The episode's first prompt: tool declarations, system, task statement, `<|gen|>`."""
    text = task.problem_statement
    if self.statement == "compact" and (block := _CODE_BLOCK.search(text)):
      text = block.group(1).rstrip()
    user = chat.render_message(self.tokenizer, chat.Message("user", text))
    return self.prefix + user.ids.tolist() + self.gen

  def prompt_tokens(self, task: Task) -> int:
    return len(self.prompt(task))

  def reset(self, task: Task) -> tuple[CodingState, list[int]]:
    first = self.prompt(task)
    return CodingState(
      agent_tools.Session(task, self.budget, self.tools), history=len(first)
    ), first

  def _job(self, state: CodingState, tokens: Sequence[int]):
    """(the harness job of a model turn, its parsed form); records the turn."""
    if state.done:
      raise ValueError("step() on a finished episode")
    text = self.tokenizer.decode([int(t) for t in tokens])
    parsed = chat.parse_assistant(self.prefill + text)
    calls = [agent_episode.Call(c.name, c.arguments) for c in parsed.tool_calls]
    index = 1 + 2 * len(state.records)  # first turn 0, then model / reply alternate
    state.records.append(TurnRecord(index, len(tokens), text, parsed.error, calls))
    state.history += len(tokens)
    state.session.tokens = state.history
    return agent_episode.Job(state.session, index, calls, parsed.error, self.grade_limits), parsed

  def _reply(self, state: CodingState, parsed, out: agent_episode.Outcome):
    """The state after a model turn's outcome, and the reply ([] once done)."""
    state.session = out.session
    state.records[-1].calls = out.calls
    if not out.done:
      reply = self._render_reply(parsed, out.calls)
      if state.history + len(reply) + self.max_turn_tokens > self.budget.max_tokens:
        out.end, out.done = f"token budget {self.budget.max_tokens} used", True
        agent_episode.judge(out, self.grade_limits)
      else:
        state.history += len(reply)
        return state, reply
    state.done, state.end, state.reward = True, out.end, out.reward
    state.grade, state.flags, state.grading_s = out.grade, out.flags, out.grading_s
    state.grade_cached = out.grade_cached
    return state, []

  def _render_reply(self, parsed, calls) -> list[int]:
    if parsed.error is not None:
      msgs = [chat.Message("system", f"error: {parsed.error}")]
    else:
      msgs = [
        chat.Message(
          "tool",
          c.observation.text if c.observation else "not run (after submit)",
          tool_call_id=tc.id,
        )
        for c, tc in zip(calls, parsed.tool_calls)
      ]
    ids = [i for m in msgs for i in chat.render_message(self.tokenizer, m).ids.tolist()]
    return ids + self.gen

  def step(self, state: CodingState, tokens: Sequence[int]) -> tuple[CodingState, list[int]]:
    """Applies one model turn; returns the state and the reply ([] once the episode is done)."""
    job, parsed = self._job(state, tokens)
    return self._reply(state, parsed, agent_episode.act(job))

  def step_many(self, states, turns) -> list[tuple[CodingState, list[int]]]:
    """`step` of many episodes, their calls and grading run concurrently on the pool."""
    jobs = [self._job(s, t) for s, t in zip(states, turns, strict=True)]
    start = time.monotonic()
    outs = self.workers.map(agent_episode.act, [job for job, _ in jobs])
    replies = [self._reply(s, parsed, out) for s, (_, parsed), out in zip(states, jobs, outs)]
    self._env_s += time.monotonic() - start  # tool calls, monitor and grading
    return replies

  def reward(self, state: CodingState) -> float:
    return state.reward

  # -- feedback and metrics ------------------------------------------------------------------
  def hint(self, text: str) -> list[int]:
    """A hint as the teacher reads it: a system message right before the judged turn, at most
    `max_hint_tokens` tokens (a longer text is cut and ends in '...')."""
    ids, words = self._hint(text), self.tokenizer.encode(text)
    while len(ids) > self.max_hint_tokens:  # ends: words shrink, and _hint("...") fits (init)
      words = words[: max(len(words) - (len(ids) - self.max_hint_tokens) - 4, 0)]
      ids = self._hint(self.tokenizer.decode(words) + "...")
    return ids

  def _hint(self, text: str) -> list[int]:
    msg = chat.render_message(self.tokenizer, chat.Message("system", text)).ids.tolist()
    return [self.stop_ids[0], *msg, *self.gen]

  def feedback(self, episode) -> list[tuple[int, list[int]]]:
    """(turn index, hint ids) of each model turn flagged by this env's feedback kinds."""
    return feedback_lib.flag_turns(self._feedbacks, self, episode)

  def episode_metrics(self, episodes) -> dict[str, float]:
    """Reward, turns, tokens, tool errors, monitor flags and grading time per episode; with a
    curriculum, records the episodes as rollouts and refreshes it (class docstring)."""
    states = [e.state for e in episodes]
    extra = self._curriculum(states) if self.pool is not None else {}
    calls = [c for s in states for r in s.records for c in r.calls if c.observation]
    mean = lambda xs: float(np.mean(xs)) if len(xs) else 0.0
    n = len(states)
    kinds = collections.Counter(f["kind"] for s in states for f in s.flags)
    if self.episode_log:
      with open(self.episode_log, "a") as log:
        log.write(json.dumps(self._episode_record(states)) + "\n")
    env_s, self._env_s = self._env_s, 0.0
    return dict(
      reward=mean([s.reward for s in states]),
      tasks_distinct=float(len({s.task.id for s in states})),
      env_s=env_s,
      grading_s_total=float(sum(s.grading_s for s in states)),
      grade_cache_hits=float(sum(s.grade_cached for s in states)),
      **{f"flags/{k}": float(v) for k, v in sorted(kinds.items())},
      turns_per_episode=mean([len(s.records) for s in states]),
      tokens_per_episode=mean([s.history for s in states]),
      tool_errors_per_episode=sum(bool(c.observation.error) for c in calls) / n,
      malformed_per_episode=sum(r.parse_error is not None for s in states for r in s.records) / n,
      unavailable_per_episode=sum(c.observation.error == "unknown_tool" for c in calls) / n,
      critical_flag_rate=mean([any(f["severity"] == "critical" for f in s.flags) for s in states]),
      submitted_rate=mean([s.end == "submit" for s in states]),
      grading_s=mean([s.grading_s for s in states]),
      **extra,
    )

  @staticmethod
  def _episode_record(states) -> dict:
    """A batch's episodes as `episode_log` keeps them: task ids drawn, rewards, flag kinds."""
    return {
      "tasks": [s.task.id for s in states],
      "rewards": [s.reward for s in states],
      "flags": [[f["kind"] for f in s.flags] for s in states],
      "ends": [s.end for s in states],
    }

  def _curriculum(self, states) -> dict[str, float]:
    for s in states:
      self.pool.record(s.task.id, s.reward)
    change = self.pool.refresh(self.harder)
    for tid in change["added"]:
      self.tasks[tid] = self.pool.tasks[tid]
      self.added.add(tid)
    for key in ("retired", "added", "admitted"):
      if change[key]:
        logging.info("curriculum: %s %s", key, ", ".join(change[key]))
    if not self.pool.active():
      logging.warning("curriculum: every task is retired; sampling from all %d", len(self.tasks))
    rates = [self.pool.stats[t].rate for t in self.pool.active() if self.pool.stats[t].rollouts]
    return {
      "curriculum/active": float(len(self.pool.active())),
      "curriculum/retired": float(len(self.pool.retired)),
      "curriculum/pass_rate": float(np.mean(rates)) if rates else 0.0,
    }
