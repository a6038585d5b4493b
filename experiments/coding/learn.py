"""Does the coding agent learn? Micro-project tasks, SFT warm-up, RL and RL + SD, held-out pass@1.

    python -m experiments.coding.learn --out workdir/coding_learn          # reduced size
    python -m experiments.coding.learn --out workdir/coding_learn --full   # full size

Stages, each reused when its outputs exist (a stopped run continues where it was):
  1. tasks: `make_tasks --micro 0:P --methods deletion` (P micro-projects through the task
     factory and its validation), or `--tasks FILE`; the deletion tasks whose oracle episode
     fits the budgets go to OUT/tasks.jsonl. RL and eval split them by project hash
     (`envs.coding.split`, `--heldout-fraction`): RL trains on the train projects only.
  2. per seed S (seeds in parallel): the supervised warm-up on the train tasks' oracle episodes
     (`experiments.run rl_coding.py:micro,arm=rl --config.warmup.only=True`, in
     OUT/seedS/warmup), then `rl_coding.py:micro,arm=rl` (RL on the train tasks) in
     OUT/seedS/rl and `rl_coding.py:micro,arm=sd` (RL + targeted self-distillation, EMA
     teacher) in OUT/seedS/sd from that warm-up (linked into both workdirs).
  3. eval, after each of them: greedy pass@1 and behaviour on the held-out tasks
     (`experiments.eval`) in OUT/seedS/eval_{warmup,rl,sd}.
  4. figure: `experiments.figures.coding_agent` over OUT (PNG + CSV; 95% t-intervals over
     seeds) in experiments/figures/results/coding_agent_{reduced,full}.
Every stage runs as a subprocess with its log in OUT (progress lines are printed as they come)
and its wall time appended to OUT/stage_times.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

from composer_jax.codetasks import task as task_lib
from composer_jax.codetasks.synthesis import split
from composer_jax.envs.coding.agent import scripts as agent_scripts
from experiments.coding import program
from experiments.configs import rl_coding

# name: (micro-projects, seeds, warm-up steps, RL steps)
SIZES = {"reduced": (16, 3, 800, 2), "full": (48, 5, 1500, 60)}
ARMS = ("rl", "sd")
_T0 = time.monotonic()


def say(text: str) -> None:
  print(f"[{(time.monotonic() - _T0) / 60:5.1f} min] {text}", flush=True)


def _run(cmd: list[str], log: Path, label: str, progress: str = "] step ") -> None:
  """Runs `cmd` with output to `log`, printing its lines that contain `progress`; its wall
  time goes to `stage_times.jsonl` beside `log`."""
  say(f"{label}: {' '.join(cmd[2:5])} ... (log {log})")
  start = time.monotonic()
  with open(log, "a") as out:
    proc = subprocess.Popen(
      cmd,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    for line in proc.stdout:
      out.write(line)
      if progress in line or line.startswith("error"):
        say(f"{label}: {line.split('] ', 1)[-1].strip()[:110]}")
  if proc.wait():
    raise SystemExit(f"{label} failed (exit {proc.returncode}); see {log}")
  with open(log.parent / "stage_times.jsonl", "a") as f:
    f.write(json.dumps({"stage": label, "wall_s": round(time.monotonic() - start, 1)}) + "\n")


def fitting(tasks: list) -> list:
  """The tasks whose oracle episode fits the micro setting: its `append` turn within
  `rl.max_new_tokens`, the episode within the budget and `warmup.seq_len`."""
  config = rl_coding.get_config("micro")
  with tempfile.TemporaryDirectory() as tmp:
    env = program.make_env(config, tmp, tasks)
  keep = []
  for t in tasks:
    turn = agent_scripts.turn_ids(
      env.tokenizer, agent_scripts.append_calls(t), thinking=config.env.thinking
    )
    try:
      episode = agent_scripts.oracle_trajectory(env, t)
    except ValueError:
      continue
    if len(turn) <= config.rl.max_new_tokens and len(episode.tokens) <= config.warmup.seq_len:
      keep.append(t)
  say(f"tasks: {len(keep)} of {len(tasks)} deletion tasks fit the budgets")
  return keep


def tasks(args, out: Path) -> Path:
  chosen = out / "tasks.jsonl"
  if chosen.exists():
    return chosen
  source = args.tasks
  if not source:
    made = out / "tasks"
    if not (made / "tasks.jsonl").exists():
      _run(
        [
          sys.executable,
          "-m",
          "composer_jax.codetasks.synthesis.make_tasks",
          "--micro",
          f"0:{args.projects}",
          "--methods",
          "deletion",
          "--max_tasks",
          "5",
          "--out",
          str(made),
        ],
        out / "make_tasks.log",
        "tasks",
        progress=": kept",
      )
    source = made / "tasks.jsonl"
  everything = fitting([t for t in task_lib.read_jsonl(source) if t.method == "deletion"])
  train, held = split.split_by_project(everything, args.heldout_fraction)
  if not train or not held:
    raise SystemExit(
      f"{source}: {len(train)} train / {len(held)} held-out deletion tasks; "
      "give more projects or another --heldout-fraction"
    )
  task_lib.write_jsonl(chosen, everything)
  say(f"tasks: {len(train)} train, {len(held)} held-out (projects split by hash)")
  return chosen


def eval_args(tasks_file: Path, checkpoint: Path, tokenizer: Path, out: Path) -> list[str]:
  """`experiments.eval` of a policy on the held-out projects, greedy; the rest of the settings
  (tools, mode, budgets, split) are the checkpoint's own saved run config."""
  return [
    sys.executable,
    "-m",
    "experiments.eval",
    f"--tasks={tasks_file}",
    "--split=heldout",
    f"--checkpoint={checkpoint}",
    "--k=1",
    "--samples=1",
    f"--out={out}",
    f"--config.env.tokenizer={tokenizer}",
    "--config.rl.temperature=0.0",
  ]


def seed_run(args, seed: int, tasks_file: Path, out: Path) -> None:
  """The warm-up (`warmup.only`) and its eval, then each arm and its eval."""
  _, _, warmup_steps, rl_steps = SIZES[args.size]
  root = out / f"seed{seed}"
  (root / "warmup").mkdir(parents=True, exist_ok=True)
  for name, arm in (("warmup", "rl"), *((a, a) for a in ARMS)):
    workdir = root / arm
    workdir.mkdir(exist_ok=True)
    if not (workdir / "warmup").exists():
      (workdir / "warmup").symlink_to(root / "warmup", target_is_directory=True)
    overrides = [
      f"--config.env.tasks={tasks_file}",
      f"--config.train.seed={seed}",
      f"--config.env.heldout_fraction={args.heldout_fraction}",
      f"--config.warmup.steps={warmup_steps}",
      f"--config.warmup.optim.total_steps={warmup_steps}",
      f"--config.train.steps={rl_steps}",
      f"--config.warmup.only={name == 'warmup'}",
    ]
    _run(
      [
        sys.executable,
        "-m",
        "experiments.run",
        f"--config=experiments/configs/rl_coding.py:micro,arm={arm}",
        f"--workdir={workdir}",
        *overrides,
      ],
      root / f"{name}.log",
      f"seed {seed} {name}",
    )
    dest = root / f"eval_{name}"
    if not (dest / "eval.json").exists():
      checkpoint = root / ("warmup" if name == "warmup" else arm)
      _run(
        eval_args(tasks_file, checkpoint, root / "rl" / "tiktoken.model", dest),
        root / f"eval_{name}.log",
        f"seed {seed} eval {name}",
        progress="pass@1",
      )
      say(f"seed {seed} eval {name}: done")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True, help="output directory (reused: stages resume)")
  p.add_argument("--full", action="store_true", help="full size (SIZES['full'])")
  p.add_argument("--tasks", default="", help="a make_tasks JSONL instead of making micro tasks")
  p.add_argument("--heldout-fraction", type=float, default=0.25)
  p.add_argument("--parallel", type=int, default=3, help="seeds run at once")
  args = p.parse_args(argv)
  args.size = "full" if args.full else "reduced"
  args.projects, seeds, _, _ = SIZES[args.size]
  out = Path(args.out).resolve()
  out.mkdir(parents=True, exist_ok=True)
  os.chdir(Path(__file__).resolve().parents[2])  # experiments/configs/... paths
  say(f"{args.size} size: {SIZES[args.size]} (projects, seeds, warm-up steps, RL steps)")
  tasks_file = tasks(args, out)
  with futures.ThreadPoolExecutor(args.parallel) as pool:
    for f in [pool.submit(seed_run, args, s, tasks_file, out) for s in range(seeds)]:
      f.result()
  results = Path("experiments/figures/results") / f"coding_agent_{args.size}"
  _run(
    [
      sys.executable,
      "-m",
      "experiments.figures.coding_agent",
      f"--workdir={out}",
      f"--results_dir={results}",
    ],
    out / "figure.log",
    "figure",
    progress="pass@1",
  )
  say(f"done: {results / 'coding_agent.png'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
