"""Evaluates a policy on coding tasks: pass@k and behavioural metrics per episode and task.

Every task is played `samples` times (`n`) by the policy through the agent harness
(`agent_env.CodingEnv`: tools in the sandbox, trajectory monitor, grader on the hidden tests);
an episode passes when its reward is 1. Per task, with c passing episodes of n,

    pass@k = 1 - C(n - c, k) / C(n, k)        (Chen et al. 2021, arXiv 2107.03374, eq. 1)

the unbiased estimate of "at least one of k samples passes", averaged over tasks. Behavioural
metrics, per episode: turns, tokens, tool calls and tool errors, malformed turns, edits and
the ruff violations they add (per turn, as the style feedback kind counts them:
`agent_feedback.added_violations`), monitor flags and critical ones, how the episode ended.

The report is data (`summarize`); writing it as files (JSON, CSV, PNG) is the CLI's
(`experiments/eval.py`).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import jax
import ml_collections
import numpy as np

from composer_jax.codetasks.synthesis.split import project_of
from composer_jax.codetasks.task import Task
from composer_jax.envs.coding.agent import env as agent_env
from composer_jax.envs.coding.agent import feedback as agent_feedback
from composer_jax.envs.coding.agent import tools as agent_tools
from composer_jax.model.config import ModelConfig
from composer_jax.rl import rollout
from composer_jax.rl.episodes import run_episodes

# Behavioural metrics averaged over episodes (the summary; the CLI's CSV columns and plot).
BEHAVIOUR = (
  "turns",
  "tokens",
  "tool_calls",
  "tool_errors",
  "malformed_turns",
  "edits",
  "style_violations",
  "monitor_flags",
  "critical_flags",
  "submitted",
)


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples with c correct (module docstring), `1 <= k <= n`."""
  if not 1 <= k <= n or not 0 <= c <= n:
    raise ValueError(f"pass@k needs 1 <= k={k} <= n={n} and 0 <= c={c} <= n")
  if n - c < k:
    return 1.0
  # 1 - prod_{i=n-c+1}^{n} (1 - k / i): the ratio of binomials without huge integers.
  return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """How episodes are played: sampling, budgets, batching."""

  k: int = 1
  samples: int = 0  # episodes per task; 0 = k
  temperature: float = 1.0
  top_p: float = 1.0
  max_turn_tokens: int = 1024
  budget: agent_tools.Budget = agent_tools.Budget()
  tools: tuple[str, ...] = agent_tools.TOOL_NAMES  # offered to the policy (as in its training)
  batch: int = 8  # episodes played in lockstep per policy call
  seed: int = 0
  thinking: bool = True  # K2.5's thinking mode, or instant (as in the policy's training)
  system: str = ""  # the system message ('' = agent_env.SYSTEM)
  statement: str = "full"  # the user message (agent_env.STATEMENTS), as in training

  @property
  def n(self) -> int:
    return self.samples or self.k

  def __post_init__(self):
    if self.k < 1 or self.n < self.k or self.batch < 1:
      raise ValueError(f"need k={self.k} >= 1, samples={self.n} >= k and batch={self.batch} >= 1")


def episode_row(task: Task, sample: int, state: agent_env.CodingState) -> dict:
  """One episode's outcome and behaviour, flat (a CSV row)."""
  calls = [c for r in state.records for c in r.calls]
  return dict(
    task=task.id,
    project=project_of(task),
    sample=sample,
    reward=float(state.reward),
    passed=bool(state.reward >= 1.0),
    end=state.end,
    turns=len(state.records),
    tokens=state.history,
    tool_calls=len(calls),
    tool_errors=sum(bool(c.observation and c.observation.error) for c in calls),
    malformed_turns=sum(r.parse_error is not None for r in state.records),
    edits=sum(c.change is not None for c in calls),
    style_violations=sum(len(agent_feedback.added_violations(r)) for r in state.records),
    monitor_flags=len(state.flags),
    critical_flags=sum(f["severity"] == "critical" for f in state.flags),
    submitted=state.end == "submit",
    grading_s=round(state.grading_s, 3),
  )


def evaluate(
  tasks: Sequence[Task],
  model_cfg: ModelConfig,
  variables: dict,
  tokenizer,
  cfg: EvalConfig,
  workers: int = 1,
) -> dict:
  """Plays `cfg.n` episodes per task with the model `variables` as the policy (sampling at
  `cfg.temperature`, `cfg.top_p`); returns the report of `play`."""
  prompt_len = cfg.budget.max_tokens
  if prompt_len + cfg.max_turn_tokens - 1 > model_cfg.max_position_embeddings:
    raise ValueError(
      f"budget max_tokens={prompt_len} + max_turn_tokens={cfg.max_turn_tokens} - 1 exceeds the "
      f"model's max_position_embeddings={model_cfg.max_position_embeddings}; lower them"
    )
  sampling = ml_collections.ConfigDict(
    dict(max_new_tokens=cfg.max_turn_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
  )
  stop_ids = (tokenizer.special_tokens["<|im_end|>"],)
  policy = rollout.make_policy(model_cfg, sampling, stop_ids, tokenizer.pad_id)
  variables = jax.tree.map(jax.numpy.asarray, variables)
  return play(tasks, lambda *a: policy(variables, *a), tokenizer, cfg, workers)


def play(tasks: Sequence[Task], policy, tokenizer, cfg: EvalConfig, workers: int = 1) -> dict:
  """Plays `cfg.n` episodes per task, `cfg.batch` at a time, through `agent_env.CodingEnv`.

  Args:
    tasks: the tasks; episode `(task, sample)` for every task and sample < `cfg.n`.
    policy: an `rl.episodes` policy, `(prompts [B, P], prompt_lens [B], key) -> (tokens,
      logprobs, lengths)`.
    tokenizer: the policy's tiktoken tokenizer.
    cfg: samples, k, budgets, batch, seed.
    workers: processes running the tools and the grader (`CodingEnv.step_many`).

  Returns:
    `summarize(rows, cfg.k)`: `summary` (pass@1..k and behavioural means), `tasks` (per task)
    and `episodes` (one row per episode).
  """
  if not tasks:
    raise ValueError("no tasks to evaluate")
  env = agent_env.CodingEnv(
    tasks,
    tokenizer,
    budget=cfg.budget,
    tools=cfg.tools,
    max_turn_tokens=cfg.max_turn_tokens,
    workers=workers,
    thinking=cfg.thinking,
    system=cfg.system or agent_env.SYSTEM,
    statement=cfg.statement,
  )
  jobs = [(t, s) for t in tasks for s in range(cfg.n)]
  key, rows = jax.random.key(cfg.seed), []
  with env:
    for start in range(0, len(jobs), cfg.batch):
      chunk = jobs[start : start + cfg.batch]
      episodes = run_episodes(
        env,
        [t for t, _ in chunk],
        list(range(len(chunk))),
        policy,
        jax.random.fold_in(key, start),
        prompt_len=cfg.budget.max_tokens,
        pad_id=env.pad_id,
      )
      rows += [episode_row(t, s, e.state) for (t, s), e in zip(chunk, episodes, strict=True)]
  return summarize(rows, cfg.k)


def summarize(rows: Sequence[dict], k: int) -> dict:
  """The report of episode rows: pass@1..k per task and overall, behavioural means."""
  by_task = collections.defaultdict(list)
  for row in rows:
    by_task[row["task"]].append(row)
  per_task = []
  for task_id, eps in sorted(by_task.items()):
    n, c = len(eps), sum(e["passed"] for e in eps)
    per_task.append(
      dict(
        task=task_id,
        project=eps[0]["project"],
        n=n,
        passed=c,
        **{f"pass@{j}": pass_at_k(n, c, j) for j in range(1, min(k, n) + 1)},
      )
    )
  summary = {
    f"pass@{j}": float(np.mean([t[f"pass@{j}"] for t in per_task]))
    for j in range(1, k + 1)
    if all(f"pass@{j}" in t for t in per_task)
  }
  summary.update({f"{m}_per_episode": float(np.mean([r[m] for r in rows])) for m in BEHAVIOUR})
  edits = sum(r["edits"] for r in rows)
  summary["style_violations_per_edit"] = (
    sum(r["style_violations"] for r in rows) / edits if edits else 0.0
  )
  summary.update(
    tasks=len(per_task),
    projects=len({t["project"] for t in per_task}),
    episodes=len(rows),
    reward=float(np.mean([r["reward"] for r in rows])),
  )
  return dict(summary=summary, tasks=per_task, episodes=list(rows))
