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
import numpy as np

from composer_jax.codetasks import cli
from composer_jax.codetasks.synthesis.split import project_of
from composer_jax.codetasks.task import Task
from composer_jax.envs.coding.agent import env as agent_env
from composer_jax.envs.coding.agent import feedback as agent_feedback
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
  """What only an evaluation has: how many episodes, in what batches, from which key. How an
  episode is played (tools, budgets, statement, mode, sampling) is the run config's, through
  the env the RL program's factory builds and its `rl` section."""

  k: int = 1
  samples: int = 0  # episodes per task; 0 = k
  batch: int = 8  # episodes played in lockstep per policy call
  seed: int = 0

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
  env: agent_env.CodingEnv,
  tasks: Sequence[Task],
  model_cfg: ModelConfig,
  variables: dict,
  sampling,
  cfg: EvalConfig,
  log=None,
) -> dict:
  """Plays `cfg.n` episodes per task in `env` with the model `variables` as the policy
  (`sampling`: the run config's `rl` section, max_new_tokens, temperature, top_p); returns
  the report of `play`."""
  policy = rollout.make_policy(model_cfg, sampling, env.stop_ids, env.pad_id)
  variables = jax.tree.map(jax.numpy.asarray, variables)
  return play(env, tasks, lambda *a: policy(variables, *a), cfg, log)


def play(
  env: agent_env.CodingEnv, tasks: Sequence[Task], policy, cfg: EvalConfig, log=None
) -> dict:
  """Plays `cfg.n` episodes per task, `cfg.batch` at a time, in `env` (entered here: its
  workers run for the evaluation); one progress line per batch (`cli.Progress`, to `log`,
  default stderr).

  Args:
    env: the coding env the episodes are played in, over (at least) `tasks`: built by the RL
      program's factory (`experiments.coding.program.make_env`), so tools, budgets, statement
      and mode are the run config's.
    tasks: the tasks; episode `(task, sample)` for every task and sample < `cfg.n`.
    policy: an `rl.episodes` policy, `(prompts [B, P], prompt_lens [B], key) -> (tokens,
      logprobs, lengths)`.
    cfg: samples, k, batch, seed.

  Returns:
    `summarize(rows, cfg.k)`: `summary` (pass@1..k and behavioural means), `tasks` (per task)
    and `episodes` (one row per episode).
  """
  if not tasks:
    raise ValueError("no tasks to evaluate")
  jobs = [(t, s) for t in tasks for s in range(cfg.n)]
  key, rows = jax.random.key(cfg.seed), []
  progress = cli.Progress("eval", len(jobs), "episodes", out=log)
  with env:
    for start in range(0, len(jobs), cfg.batch):
      chunk = jobs[start : start + cfg.batch]
      episodes = run_episodes(
        env,
        [t for t, _ in chunk],
        list(range(len(chunk))),
        policy,
        jax.random.fold_in(key, start),
        prompt_len=env.budget.max_tokens,
        pad_id=env.pad_id,
      )
      rows += [episode_row(t, s, e.state) for (t, s), e in zip(chunk, episodes, strict=True)]
      passed = sum(r["passed"] for r in rows)
      progress.update(len(rows), f"{passed} passed")
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
