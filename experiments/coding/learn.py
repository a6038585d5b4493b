"""Does RL make a better coding agent? Micro-project tasks, a warm-up chosen for RL, RL arms
against an lr-0 control, held-out pass@1 with paired bootstrap intervals.

    python -m experiments.coding.learn --size=smoke   --out=workdir/coding_smoke    # every stage
    python -m experiments.coding.learn --size=reduced --out=workdir/coding_reduced  # README
    python -m experiments.coding.learn --size=full    --out=workdir/coding_full \\
        --publish=coding_agent_full       # also copies summary.json + figure into the repo

Stages (subprocesses, `experiments.coding.stages`: they die with this run; one live run per
OUT; a re-run resumes each stage where it stopped):
  1. tasks: `make_tasks --micro 0:P --methods deletion` (P micro-projects through the task
     factory and its sandboxed validation); the tasks whose oracle episode fits the budgets
     are split by project hash (`codetasks.synthesis.split`) into held-out projects
     (`--heldout_fraction`; the templates `microprojects.HELDOUT_ONLY` occur only there),
     validation projects (`VAL_FRACTION` of the rest, split seed 1) and train projects:
     OUT/split/{train,val,heldout}.jsonl.
  2. per seed S, the warm-up (`rl_coding.py:micro --config.warmup.only=True` on the train
     tasks' oracle episodes) in chunks of `warmup_every` steps; after each chunk its policy
     plays the curve tasks (`curve_tasks` of each split: val, held-out, train), greedy and sampled
     at the RL temperature (`samples` episodes a task): OUT/seedS/warmup_curve.jsonl. It
     stops at the first chunk whose sampled val pass@1 reaches `VAL_BAND[0]`
     (OUT/seedS/warmup_choice.json: its step and whether it is inside `VAL_BAND`); the
     held-out projects never choose it.
  3. per seed and arm of `ARMS` (a data table: an arm is a config and overrides), RL from that
     warm-up on the train tasks in OUT/seedS/ARM, then its held-out eval, greedy (pass@1) and
     sampled (pass@k at T=1): OUT/seedS/eval_ARM_{greedy,sampled}.
  4. summary: OUT/summary.json (per arm pass@1 with a 95% paired bootstrap interval over tasks
     and seeds, the paired difference to the warm-up, pass@k, behaviour, the warm-up curves
     and the RL probes) and OUT/coding_agent.png (`experiments.figures.coding_agent`).
Nothing is written outside OUT, except by `--publish=NAME`: summary.json and the figure
copied into experiments/figures/results/NAME/ after the run. Measured (RESULTS, 2026-12-08):
smoke 23 min on 2 shared CPU cores at load 13-15; reduced and full not yet timed.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tempfile
from concurrent import futures
from pathlib import Path

from absl import app, flags

from composer_jax.codetasks import task as task_lib
from composer_jax.codetasks.synthesis import microprojects, split
from composer_jax.envs.coding.agent import scripts as agent_scripts
from composer_jax.host import files as host_files
from composer_jax.train import workdir_lock
from experiments.coding import program
from experiments.coding.stages import StageFailed, Stages, say
from experiments.configs import rl_coding
from experiments.figures import coding_agent


@dataclasses.dataclass(frozen=True)
class Size:
  projects: int  # micro-projects 0..P-1
  tasks_per_project: int  # make_tasks --max_tasks
  seeds: int
  warmup_every: int  # warm-up steps between validation checks (and checkpoints)
  warmup_max: int  # the warm-up's schedule length and its last check
  rl_steps: int
  groups: int  # distinct tasks per RL step
  group_size: int  # episodes per task
  samples: int  # sampled episodes per task in eval: pass@1 and pass@samples at T=1
  curve_tasks: int  # the warm-up curve's tasks per split (val, held-out, train), at most


SIZES = {
  "smoke": Size(4, 2, 1, 4, 4, 1, 2, 2, 2, 2),
  "reduced": Size(24, 12, 3, 200, 800, 6, 8, 4, 4, 16),
  "full": Size(48, 12, 3, 150, 1500, 20, 8, 4, 4, 24),
}


@dataclasses.dataclass(frozen=True)
class Arm:
  """An RL arm: `rl_coding.py:micro,arm=<config>` with `--config.<key>=<value>` overrides."""

  config: str
  overrides: tuple[tuple[str, object], ...] = ()


# The warm-up itself is the arm 'warmup' (no RL); `lr0` is RL at learning rate 0 from the same
# warm-up: the noise floor of every other arm. An SD variant is one entry `sd_<variant>`.
ARMS = {
  "lr0": Arm("rl", (("optim.adam_lr", 0.0),)),
  "rl": Arm("rl"),
  "sd_hint": Arm("sd"),
}
VAL_FRACTION = 0.2  # of the train projects, for choosing the warm-up (split seed 1)
VAL_BAND = (0.2, 0.5)  # sampled val pass@1 at which the warm-up stops

_SIZE = flags.DEFINE_enum("size", "smoke", list(SIZES), "experiment size (SIZES)")
_OUT = flags.DEFINE_string("out", None, "output directory (a re-run resumes)", required=True)
_HELDOUT = flags.DEFINE_float(
  "heldout_fraction",
  microprojects.HELDOUT_FRACTION,
  f"projects held out (>= microprojects.HELDOUT_FRACTION={microprojects.HELDOUT_FRACTION}, "
  "so the held-out-only templates stay held out)",
  lower_bound=microprojects.HELDOUT_FRACTION,
  upper_bound=0.9,
)
_PARALLEL = flags.DEFINE_integer("parallel", 2, "stages run at once", lower_bound=1)
_SEEDS = flags.DEFINE_integer("seeds", 0, "seeds (0: the size's)", lower_bound=0)
_PUBLISH = flags.DEFINE_string(
  "publish", "", "copy summary.json + the figure to experiments/figures/results/NAME/"
)


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
  return keep


def make_splits(stages: Stages, size: Size, out: Path) -> dict[str, Path]:
  """Stage 1: OUT/split/{train,val,heldout,curve}.jsonl (module docstring)."""
  files = {k: out / "split" / f"{k}.jsonl" for k in ("train", "val", "heldout", "curve")}
  if all(f.exists() for f in files.values()):
    return files
  made = out / "tasks"
  if not (made / "tasks.jsonl").exists():
    stages.run(
      [sys.executable, "-m", "composer_jax.codetasks.synthesis.make_tasks", "--micro",
       f"0:{size.projects}", "--methods", "deletion", "--max_tasks",
       str(size.tasks_per_project), "--out", str(made)],
      out / "make_tasks.log", "tasks", progress=": kept",
    )  # fmt: skip
  everything = fitting([t for t in task_lib.read_jsonl(made / "tasks.jsonl")])
  rest, held = split.split_by_project(everything, _HELDOUT.value)
  train, val = split.split_by_project(rest, VAL_FRACTION, seed=1)
  parts = {"train": train, "val": val, "heldout": held}
  count = lambda ts: f"{len(ts)} tasks of {len({split.project_of(t) for t in ts})} projects"
  if not all(parts.values()):
    raise SystemExit(
      f"{made / 'tasks.jsonl'}: "
      + ", ".join(f"{k} {count(v)}" for k, v in parts.items())
      + "; every split needs a project: raise --size or lower --heldout_fraction"
    )
  parts["curve"] = sum((ts[: size.curve_tasks] for ts in (val, held, train)), [])
  (out / "split").mkdir(exist_ok=True)
  for name, ts in parts.items():
    task_lib.write_jsonl(files[name], ts)
  say("tasks: " + ", ".join(f"{k} {count(parts[k])}" for k in ("train", "val", "heldout")))
  return files


def eval_command(
  checkpoint: Path, tokenizer: Path, tasks_file: Path, out: Path, greedy: bool, k: int
) -> list:
  """`experiments.eval` of `checkpoint` on every task of `tasks_file`, played as the policy
  was trained (eval reads the checkpoint's own saved run config: tools, mode, budgets),
  greedy (pass@1) or at the RL temperature with `k` episodes a task (pass@1 estimated from
  them, and pass@k)."""
  return [
    sys.executable, "-m", "experiments.eval", f"--tasks={tasks_file}", "--split=all",
    f"--checkpoint={checkpoint}", f"--config.env.tokenizer={tokenizer}",
    f"--k={1 if greedy else k}", f"--samples={1 if greedy else k}", "--batch=32",
    f"--out={out}", *(["--config.rl.temperature=0.0"] if greedy else []),
  ]  # fmt: skip


def _evaluate(stages, checkpoint: Path, tasks_file: Path, dest: str, root: Path, k: int):
  for mode in ("greedy", "sampled"):
    out = root / f"{dest}_{mode}"
    if not (out / "eval.json").exists():
      tokenizer = root / "warmup_run" / "tiktoken.model"  # the warm-up program wrote it
      cmd = eval_command(checkpoint, tokenizer, tasks_file, out, mode == "greedy", k)
      stages.run(cmd, root / f"{dest}_{mode}.log", f"{root.name} eval {dest} {mode}", "pass@1")


def _run_command(arm: str, workdir: Path, files, size: Size, seed: int, steps: int, out: Path):
  spec = ARMS.get(arm, Arm("rl"))
  overrides = {
    "env.tasks": files["train"],
    "env.heldout_fraction": 0.0,  # the file holds the train projects only
    "train.seed": seed,
    "train.steps": size.rl_steps,
    "train.compile_cache_dir": out / "compile_cache",
    "warmup.steps": steps,
    "warmup.only": arm == "warmup",
    "warmup.optim.total_steps": size.warmup_max,
    "warmup.optim.warmup_steps": min(10, size.warmup_max // 4),
    "warmup.ckpt_every": size.warmup_every,
    "warmup.check_every": size.warmup_every,
    "warmup.keep": size.warmup_max // size.warmup_every + 1,
    "rl.groups": size.groups,
    "rl.group_size": size.group_size,
    **dict(spec.overrides),
  }
  return [
    sys.executable, "-m", "experiments.run",
    f"--config=experiments/configs/rl_coding.py:micro,arm={spec.config}",
    f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in overrides.items()),
  ]  # fmt: skip


def _linked(root: Path, name: str) -> Path:
  """OUT/seedS/NAME with its `warmup` linking to the seed's warm-up (a relative link, inside
  OUT)."""
  workdir = root / name
  workdir.mkdir(parents=True, exist_ok=True)
  if not (workdir / "warmup").is_symlink():
    (workdir / "warmup").symlink_to("../warmup", target_is_directory=True)
  return workdir


def warmup_stage(stages: Stages, size: Size, seed: int, files, out: Path) -> int:
  """Stage 2 for one seed: the chosen warm-up step (module docstring)."""
  root = out / f"seed{seed}"
  choice = root / "warmup_choice.json"
  if choice.exists():
    return json.loads(choice.read_text())["step"]
  (root / "warmup").mkdir(parents=True, exist_ok=True)
  prog = _linked(root, "warmup_run")
  curve = root / "warmup_curve.jsonl"
  done = {p["step"]: p for p in coding_agent.read_jsonl(curve)}  # checked before a stop
  for step in range(size.warmup_every, size.warmup_max + 1, size.warmup_every):
    point = done.get(step)
    if point is None:
      cmd = _run_command("warmup", prog, files, size, seed, step, out)
      stages.run(cmd, root / "warmup.log", f"seed{seed} warm-up to {step}")
      dest = f"curve/step{step}"
      (root / "curve").mkdir(exist_ok=True)
      _evaluate(stages, root / "warmup", files["curve"], dest, root, size.samples)
      point = {"step": step, **coding_agent.split_pass1(root / dest, files)}
      with host_files.open_append(str(curve)) as f:
        f.write((json.dumps(point) + "\n").encode())
    say(f"seed{seed} warm-up step {step}: {coding_agent.describe_point(point)}")
    if point["val_sampled"] >= VAL_BAND[0]:
      break
  band = VAL_BAND[0] <= point["val_sampled"] <= VAL_BAND[1]
  record = {"step": step, "in_band": band, "band": VAL_BAND, **point}
  host_files.write_bytes(str(choice), json.dumps(record).encode())
  return step


def arm_stage(stages: Stages, size: Size, seed: int, arm: str, step: int, files, out: Path):
  """Stage 3 for one seed and arm: RL from the chosen warm-up, then its held-out evals. The
  arm 'warmup' is that warm-up's held-out evals, unless the curve's already cover every
  held-out task (then the summary reads those)."""
  root = out / f"seed{seed}"
  if all((root / f"eval_{arm}_{m}" / "eval.json").exists() for m in ("greedy", "sampled")):
    return
  if arm == "warmup":
    if len(coding_agent.read_jsonl(files["heldout"])) > size.curve_tasks:
      _evaluate(stages, root / "warmup", files["heldout"], "eval_warmup", root, size.samples)
    return
  workdir = _linked(root, arm)
  stages.run(
    _run_command(arm, workdir, files, size, seed, step, out), root / f"{arm}.log",
    f"seed{seed} {arm}",
  )  # fmt: skip
  _evaluate(stages, workdir, files["heldout"], f"eval_{arm}", root, size.samples)


def planned_stages(size: Size) -> int:
  """Stages of a run that warms up to `warmup_max` (an early stop runs fewer)."""
  chunks = size.warmup_max // size.warmup_every
  return 1 + size.seeds * (chunks * 3 + 2 + len(ARMS) * 3)


def experiment(stages: Stages, size: Size, out: Path) -> Path:
  files = make_splits(stages, size, out)
  with futures.ThreadPoolExecutor(_PARALLEL.value) as pool:
    steps = list(pool.map(lambda s: warmup_stage(stages, size, s, files, out), range(size.seeds)))
    jobs = [
      pool.submit(arm_stage, stages, size, s, arm, steps[s], files, out)
      for s in range(size.seeds)
      for arm in ("warmup", *ARMS)
    ]
    for job in jobs:
      job.result()
  summary = coding_agent.write_summary(out, files, ["warmup", *ARMS], size.samples)
  say(f"summary: {out / 'summary.json'}")
  for line in coding_agent.describe(summary):
    say(line)
  return out / "summary.json"


def publish(out: Path, name: str) -> Path:
  """Copies OUT's summary.json and figure into experiments/figures/results/NAME/."""
  dest = Path(__file__).resolve().parents[1] / "figures" / "results" / name
  dest.mkdir(parents=True, exist_ok=True)
  for file in ("summary.json", coding_agent.FIGURE):
    host_files.write_bytes(str(dest / file), host_files.read_bytes(str(out / file)))
  return dest


def _check_run(out: Path, size: Size) -> None:
  """OUT/size.json records the size a run was started with; a re-run with another is refused
  (its tasks, splits and warm-ups would be reused silently)."""
  record = out / "size.json"
  if record.exists():
    was = json.loads(host_files.read_bytes(str(record)))
    if was != dataclasses.asdict(size):
      raise SystemExit(
        f"error: --out={out} holds a run of another size ({was}); pass a new --out to run {size}"
      )
  else:
    host_files.write_bytes(str(record), json.dumps(dataclasses.asdict(size)).encode())


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; flags only (--size, --out)")
  size, out = SIZES[_SIZE.value], Path(_OUT.value).resolve()
  if _SEEDS.value:
    size = dataclasses.replace(size, seeds=_SEEDS.value)
  if _PUBLISH.value and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", _PUBLISH.value):
    raise SystemExit(
      f"error: --publish={_PUBLISH.value!r}: give a directory name (letters, digits, _ . -) "
      "for experiments/figures/results/NAME"
    )
  if why := host_files.not_a_directory(str(out)):
    raise SystemExit(f"error: --out={out}: {why}; pass a directory (new, or this run's own)")
  say(f"{_SIZE.value} size: {size}")
  env = {"JAX_COMPILATION_CACHE_DIR": str(out / "compile_cache")}
  try:
    with Stages(out, planned_stages(size), _PARALLEL.value, env) as stages:
      _check_run(out, size)
      experiment(stages, size, out)
  except (StageFailed, workdir_lock.WorkdirLockedError, workdir_lock.WorkdirUnusableError) as e:
    raise SystemExit(f"error: {e}") from None
  if _PUBLISH.value:
    say(f"published: {publish(out, _PUBLISH.value)}")
  return 0


if __name__ == "__main__":
  app.run(main)
