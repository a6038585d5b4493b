"""Evaluates a checkpoint on coding tasks: pass@k on a held-out split and behaviour metrics.

  python -m experiments.eval --tasks F.jsonl --checkpoint DIR --k K [--out DIR] \
      [--config.rl.temperature=0.7 --config.env.max_turns=10 ...]

`--checkpoint`: an imported checkpoint (`composer_jax.convert.import_hf`), a Hugging Face
directory, or a training / RL workdir (newest checkpoint) — `train.load_checkpoint`.
`--tokenizer`: a tiktoken file with Kimi's special tokens (or a directory holding
`tiktoken.model`); default: the checkpoint's own `tiktoken.model` (an RL workdir keeps its
tokenizer there).
The episodes are played with the run config's settings (`settings`): for a training or RL
workdir its own saved run config (`train.load_checkpoint.run_config`), so the policy is
evaluated as it was trained; `--config.SECTION.FIELD=VALUE` overrides any of them, named as
in the run config (`experiments/configs/base.py`):
  env.heldout_fraction, env.split_seed  the split by project (`codetasks.synthesis.split`); the
                                        held-out split is evaluated unless `--split all`
  env.tools, env.max_turns              the tools offered, the turns of an episode
  rl.seq_len, rl.max_new_tokens         the episode's and a turn's token budgets (seq_len 0:
                                        what the model's positions allow, at most 32768)
  env.thinking, env.system,             K2.5's thinking or instant pre-fill, the system message
  env.statement                         ('' = the agent's), 'full' or 'compact' statement
  rl.temperature, rl.top_p              sampling
A checkpoint without a run config (imported, Hugging Face) is played with 0.2, 0, every tool,
30 turns, thinking mode, the agent's system message, the full statement, 0 and 1024 tokens,
temperature and top-p 1. Budgets are checked against the model
and every task's first prompt before any episode, one line. Writes `eval.json`,
`episodes.csv` and `eval.png` under `--out` (default `<checkpoint>/eval`) and prints the
summary.

Every input is checked before any episode is played; bad input exits 1 with one line: a
task file that is not JSONL or has a malformed record (a field of the wrong type, a
workspace that does not unpack; the message names the line), no tasks, bad settings, a
missing tokenizer, an unreadable checkpoint, an `--out` that is a file, is or holds an
input, or holds files other than an earlier evaluation's. The results are written beside
`--out` and renamed into place when complete (`convert.outputs`); if they cannot be written
after all (disk full), the whole report is printed to stdout instead of being lost.
"""

import argparse
import csv
import json
import os
import sys

import matplotlib
import ml_collections

from composer_jax.codetasks import task as task_lib
from composer_jax.codetasks.sandbox import bwrap
from composer_jax.codetasks.synthesis import split
from composer_jax.convert import outputs
from composer_jax.data import tokenizer as tok_lib
from composer_jax.envs.coding.agent import tools as agent_tools
from composer_jax.envs.coding.evaluation import evaluate
from composer_jax.parallel import backend
from composer_jax.train import load_checkpoint
from experiments.configs import base

matplotlib.use("Agg")  # Files only: no display on a cluster or in CI.
import matplotlib.pyplot as plt  # noqa: E402

REPORT_FILES = {"json": "eval.json", "csv": "episodes.csv", "png": "eval.png"}  # by kind


def write_report(report: dict, out_dir: str, meta: dict) -> dict[str, str]:
  """Writes `eval.json` (meta + report), `episodes.csv` and `eval.png` under `out_dir`;
  returns their paths by kind."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {kind: os.path.join(out_dir, name) for kind, name in REPORT_FILES.items()}
  with open(paths["json"], "w") as f:
    json.dump({"meta": meta, **report}, f, indent=1, sort_keys=True)
  with open(paths["csv"], "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(report["episodes"][0]))
    writer.writeheader()
    writer.writerows(report["episodes"])
  _plot(report["summary"], paths["png"], title=meta.get("checkpoint", ""))
  return paths


def _plot(summary: dict, path: str, title: str) -> None:
  ks = sorted(int(name[5:]) for name in summary if name.startswith("pass@"))
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  left.plot(ks, [summary[f"pass@{k}"] for k in ks], "o-")
  left.set(
    xlabel="k",
    ylabel="pass@k",
    ylim=(0, 1.02),
    xticks=ks,
    title=f"{summary['tasks']} tasks, {summary['projects']} projects, "
    f"{summary['episodes']} episodes",
  )
  # Counts per episode share one axis; tokens (hundreds to thousands) go in the title.
  names = [f"{m}_per_episode" for m in evaluate.BEHAVIOUR if m != "tokens"]
  names += ["style_violations_per_edit"]
  values = [summary[n] for n in names]
  right.barh(range(len(names)), values)
  for i, v in enumerate(values):
    right.annotate(
      f"{v:.2f}", (v, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7
    )
  right.set_yticks(range(len(names)), [n.replace("_", " ") for n in names], fontsize=8)
  right.set(title=f"behaviour (mean); {summary['tokens_per_episode']:.0f} tokens per episode")
  fig.suptitle(os.path.basename(os.path.normpath(title)) or "eval", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def _args(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tasks", required=True, help="task JSONL (envs/coding make_tasks output)")
  p.add_argument("--checkpoint", required=True, help="checkpoint directory (module docstring)")
  p.add_argument("--k", type=int, default=1, help="largest k of pass@k")
  p.add_argument("--samples", type=int, default=0, help="episodes per task (default k)")
  p.add_argument("--tokenizer", default="", help="tiktoken file or directory")
  p.add_argument("--out", default="", help="output directory (default <checkpoint>/eval)")
  p.add_argument("--split", choices=("heldout", "train", "all"), default="heldout")
  p.add_argument("--batch", type=int, default=8, help="episodes per policy call")
  p.add_argument("--workers", type=int, default=1, help="processes running tools and grading")
  p.add_argument("--seed", type=int, default=0)
  args, rest = p.parse_known_args(argv)
  unknown = [a for a in rest if not a.startswith("--config.")]
  if unknown:
    p.error(f"unrecognized arguments: {' '.join(unknown)}")
  args.overrides = rest
  return args


def defaults() -> ml_collections.ConfigDict:
  """The run-config fields eval reads, with its values for a checkpoint that has none."""
  return ml_collections.ConfigDict(
    {
      "env": {
        "heldout_fraction": 0.2,
        "split_seed": 0,
        "tools": tuple(agent_tools.TOOL_NAMES),
        "max_turns": 30,
        "thinking": True,
        "system": "",
        "statement": "full",
      },
      "rl": {"seq_len": 0, "max_new_tokens": 1024, "temperature": 1.0, "top_p": 1.0},
    }
  )


def _value(text: str, current):
  """`--config.` override text as the type of the field's current value."""
  if isinstance(current, (tuple, list)):
    return tuple(t.strip().strip("'\"") for t in text.strip("()[]").split(",") if t.strip())
  if isinstance(current, bool):
    if text.lower() not in ("true", "false"):
      raise ValueError(f"{text!r} is not true or false")
    return text.lower() == "true"
  return type(current)(text)


def settings(run: dict, overrides: list[str]) -> ml_collections.ConfigDict:
  """`defaults()`, each field replaced by the checkpoint's run config `run` where it has it
  ({} for none), then by the `--config.SECTION.FIELD=VALUE` `overrides`.

  Raises:
    ValueError: an override names no field of `defaults()` or gives a value of another type.
  """
  c = defaults()
  for section, fields in c.items():
    for name in fields:
      if name in run.get(section, {}):
        value = run[section][name]
        fields[name] = tuple(value) if isinstance(fields[name], tuple) else value
  known = [f"{s}.{n}" for s, fields in c.items() for n in fields]
  for flag in overrides:
    path, eq, text = flag.removeprefix("--config.").partition("=")
    if path not in known or not eq:
      raise ValueError(f"{flag}: eval reads --config.FIELD=VALUE for the fields {known}")
    section, name = path.split(".")
    try:
      c[section][name] = _value(text, c[section][name])
    except (TypeError, ValueError) as e:
      raise ValueError(f"{flag}: {e}") from None
  base.check_numbers(c)  # the run config's one range table
  return c


def _tasks(args, env) -> list:
  tasks = task_lib.load_jsonl(args.tasks)  # none, or a repeated id: one line already
  if args.split == "all":
    return tasks
  train, held = split.split_by_project(tasks, env.heldout_fraction, env.split_seed)
  chosen = held if args.split == "heldout" else train
  if not chosen:
    raise ValueError(
      f"the {args.split} split of {args.tasks} is empty (projects: "
      f"{sorted({split.project_of(t) for t in tasks})}, env.heldout_fraction "
      f"{env.heldout_fraction}); change it (--config.env.heldout_fraction=F) "
      "or use --split all"
    )
  return chosen


def _tokenizer(args):
  path = args.tokenizer or tok_lib.find_tokenizer_near(args.checkpoint)
  if not path:
    raise ValueError(
      f"no tokenizer: {args.checkpoint} has no {tok_lib.TIKTOKEN_FILENAME}; pass "
      "--tokenizer FILE (a tiktoken file with Kimi's special tokens)"
    )
  tok = tok_lib.load_tokenizer({"tokenizer": path})
  if not isinstance(tok, tok_lib.TiktokenTokenizer):
    raise ValueError(f"--tokenizer {path!r}: the chat format needs a tiktoken file, not 'byte'")
  return tok


def main(argv=None) -> int:
  args = _args(argv)
  backend.ready_or_exit()
  try:  # Every input first: nothing below fails after the evaluation.
    out = outputs.check(
      args.out or f"{args.checkpoint}/eval",
      inputs=[args.checkpoint, args.tasks],
      inside_inputs=True,
      replaceable=REPORT_FILES.values(),
    )
    run = settings(load_checkpoint.run_config(args.checkpoint), args.overrides)
    env, rl = run.env, run.rl
    tasks = _tasks(args, env)
    agent_tools.Session.check_tools(tuple(env.tools))
    tokenizer = _tokenizer(args)
    model_cfg, variables = load_checkpoint.load(args.checkpoint)
    if not rl.seq_len:  # what the sampler can hold, at most 32768
      rl.seq_len = min(32768, model_cfg.max_position_embeddings - rl.max_new_tokens + 1)
    if tokenizer.vocab_size > model_cfg.vocab_size:
      raise ValueError(
        f"tokenizer {tokenizer.path} has {tokenizer.vocab_size} ids, more than "
        f"the checkpoint's vocab_size {model_cfg.vocab_size}"
      )
    cfg = evaluate.EvalConfig(
      k=args.k,
      samples=args.samples,
      temperature=rl.temperature,
      top_p=rl.top_p,
      max_turn_tokens=rl.max_new_tokens,
      batch=args.batch,
      seed=args.seed,
      tools=tuple(env.tools),
      thinking=env.thinking,
      system=env.system,
      statement=env.statement,
      budget=agent_tools.Budget(max_turns=env.max_turns, max_tokens=rl.seq_len),
    )
    report = evaluate.evaluate(tasks, model_cfg, variables, tokenizer, cfg, args.workers)
  except (OSError, ValueError, bwrap.SandboxUnavailable) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  meta = {
    **vars(args),
    "settings": run.to_dict(),
    "split_projects": sorted({split.project_of(t) for t in tasks}),
  }
  try:
    with outputs.staged(out) as tmp:
      write_report(report, tmp, meta)
  except OSError as e:
    print(json.dumps({"meta": meta, **report}, sort_keys=True))
    print(
      f"error: cannot write the results to {out} ({e}); the whole report is on stdout",
      file=sys.stderr,
    )
    return 1
  paths = {kind: os.path.join(out, name) for kind, name in REPORT_FILES.items()}
  print(json.dumps({**report["summary"], "files": paths}, indent=1, sort_keys=True))
  return 0


if __name__ == "__main__":
  sys.exit(main())
