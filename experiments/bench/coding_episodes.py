"""Benchmark: coding episodes per minute, environment steps on a worker pool vs sequential.

  python -m experiments.bench.coding_episodes --tasks F.jsonl [--episodes 8] [--workers 2] \\
      [--rounds 3] [--backend local|ray]

Each episode is a scripted oracle (`envs.coding.agent.scripts`: list the root, apply the gold
patch with edit / write_file, run the visible tests, submit) on the next task, the file's
projects taken in turn,
through `CodingEnv` and `rl.episodes.run_episodes`; no model runs, so the figure is the
environment's own throughput (sandboxed commands, the trajectory monitor, two graded test
runs). Sequential = one process steps every episode in turn (`workers=1`); pool = the live
episodes of each round stepped at once on `--workers` workers kept up for the whole run.
Both play the same episodes, alternating in `--rounds` timed rounds after one untimed
(`timing.interleaved`); reported: median episodes/min of each and the ratio pool /
sequential. Every oracle episode must score 1 (checked).
"""

import json
import tempfile
from pathlib import Path

from absl import app, flags

from composer_jax.codetasks import cli, task
from composer_jax.data.tokenizer import TiktokenTokenizer, write_byte_ranks
from composer_jax.envs.coding.agent import env as agent_env
from composer_jax.envs.coding.agent import scripts as agent_scripts
from composer_jax.envs.coding.agent import tools as agent_tools
from experiments.bench import timing


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_string(
    "tasks", None, "task JSONL (make_tasks output)", required=True, flag_values=fv
  )
  flags.DEFINE_integer("episodes", 8, "episodes per round", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("workers", 2, "pool size", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("rounds", 3, "alternations", lower_bound=1, flag_values=fv)
  flags.DEFINE_enum("backend", "local", ["local", "ray"], "worker pool", flag_values=fv)


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = flags.FLAGS
  try:
    tasks = task.load_jsonl(args.tasks)
  except (OSError, ValueError) as e:
    raise SystemExit(f"error: {e}") from None
  if not tasks:
    raise SystemExit(f"error: {args.tasks} has no tasks")
  by_project: dict[str, list] = {}
  for t in tasks:
    by_project.setdefault(t.source["name"], []).append(t)
  mixed = [ts[i] for i in range(len(tasks)) for ts in by_project.values() if i < len(ts)]
  chosen = [mixed[i % len(mixed)] for i in range(args.episodes)]  # projects round-robin
  tok = TiktokenTokenizer(write_byte_ranks(str(Path(tempfile.mkdtemp()) / "bytes.tiktoken")))

  def script(t):
    turn = lambda *calls: agent_scripts.turn_ids(tok, calls)
    read = agent_scripts.call("list_dir")
    run = agent_scripts.call("run", tests=[])
    return [
      turn(read),
      turn(*agent_scripts.oracle_calls(t)),
      turn(run),
      turn(agent_scripts.call("submit")),
    ]

  scripts = [script(t) for t in chosen]
  budget = agent_tools.Budget(max_turns=8, max_tokens=1 << 20)
  kw = dict(budget=budget, max_turn_tokens=1 << 16)
  seq = agent_env.CodingEnv(tasks, tok, **kw)
  pool = agent_env.CodingEnv(tasks, tok, workers=args.workers, backend=args.backend, **kw)

  def play(env):
    eps = agent_scripts.play(env, chosen, scripts)
    bad = [e.task.id for e in eps if e.state.reward != 1.0]
    if bad:
      raise RuntimeError(f"oracle episodes did not score 1: {bad}")

  with pool:
    secs = timing.interleaved(
      {"sequential": lambda: play(seq), "pool": lambda: play(pool)}, args.rounds
    )
  per_min = {k: round(60 * args.episodes / v, 2) for k, v in secs.items()}
  out = {
    "episodes": args.episodes,
    "tasks": sorted({t.id for t in chosen}),
    "workers": args.workers,
    "backend": args.backend,
    "rounds": args.rounds,
    "episodes_per_min_sequential": per_min["sequential"],
    "episodes_per_min_pool": per_min["pool"],
    "ratio_pool_vs_sequential": round(secs["sequential"] / secs["pool"], 2),
  }
  print(json.dumps(out, indent=1))


_parse_flags = cli.parse_flags(define_flags)  # app.run's parser (and tests/docs_commands_test)

if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
