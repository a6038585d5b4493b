"""Evaluates a checkpoint on coding tasks: pass@k on a held-out split and behaviour metrics.

  python -m experiments.eval --checkpoint=DIR [--tasks=F.jsonl] [--k=K] [--out=DIR] \
      [--config=experiments/configs/rl_coding.py[:ARG]] [--config.rl.temperature=0.7 ...]

`--checkpoint`: an imported checkpoint (`composer_jax.convert.import_hf`), a Hugging Face
directory, or a training / RL workdir (newest checkpoint) — `train.load_checkpoint`.

One run config says how the episodes are played, in the schema of the coding RL program
(`experiments/configs/rl_coding.py`), from one of:
  * a coding RL workdir (or its warm-up): its own saved run config, so the policy plays as it
    was trained (then `--config=FILE` is refused: there is one source of settings);
  * any other checkpoint (imported, Hugging Face, a supervised workdir such as the default
    run's): the `--config` file (default `rl_coding.py`: the RL program's own defaults;
    `rl_coding.py:pod` for Kimi K2.5's settings).
Its `model` section is the checkpoint's; `--config.SECTION.FIELD=VALUE` overrides any field
with the grammar of `experiments.run` (ml_collections config flags: typed, an unknown field is
one line; a tuple is `--config.env.tools="('edit','submit')"`); a model override may change
runtime fields only (dtype, kernels), not the architecture. The environment is the RL
program's (`experiments.coding.program.make_env`): tools, budgets (`env.max_turns`,
`rl.seq_len`, `rl.max_new_tokens`; lengths at 0 derived from the tasks, all checked against
the model before any episode), statement, system message, thinking mode, feedback kinds;
without the curriculum (every task is played `--samples` times), its tools and grader on
`env.workers` processes. Sampling: `rl.temperature`, `rl.top_p`. Split: `env.heldout_fraction`, `env.split_seed` (`codetasks.synthesis.split`, as RL
used them); `--split`. Tokenizer: `--config.env.tokenizer` when given, else the checkpoint's
own `tiktoken.model` (an RL workdir keeps its tokenizer there), else the config's
`env.tokenizer` ('bytes': the 256-byte tokenizer that ships with the code, the one a
byte-level checkpoint such as the default run's reads). `--tasks`: a make_tasks JSONL or
micro:START:STOP, default the config's `env.tasks`.

Writes `eval.json` (with the settings played), `episodes.csv` and `eval.png` under `--out`
(default `<checkpoint>/eval`) and prints the summary; one progress line per batch of episodes
(done/total, rate, ETA) on stderr.

Every input is checked before any episode is played. A bad flag (unknown, out of range, an
`--out` that is a file or under one, an unknown config field) exits 2 with one line; other bad
input exits 1 with one line: a task file that is not JSONL or has a malformed record (the
message names the line), no tasks, bad settings, a missing tokenizer, an unreadable checkpoint,
an `--out` that is or holds an input, or holds files other than an earlier evaluation's. The
results are written beside `--out` and renamed into place when complete (`tools.outputs`); if
they cannot be written after all (disk full), the whole report is printed to stdout instead.
"""

import csv
import functools
import json
import os
import sys
import tempfile

import matplotlib
import ml_collections
from absl import flags
from ml_collections import config_flags

from composer_jax.codetasks import cli
from composer_jax.codetasks.sandbox import bwrap
from composer_jax.codetasks.synthesis import split
from composer_jax.convert import outputs
from composer_jax.data import tokenizer as tok_lib
from composer_jax.envs.coding.evaluation import evaluate
from composer_jax.model import config as model_config
from composer_jax.parallel import backend
from composer_jax.train import checkpointing, load_checkpoint
from experiments.coding import program
from experiments.config_cli import CONFIG_DIR, config_error
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


# pass@k needs n >= k episodes per task, each a whole agent episode (seconds to minutes):
# Chen et al. (arXiv 2107.03374) report up to pass@100 from n = 200; 1000 episodes a task is
# well past any published estimate and already days of sampling, so more is a typo.
MAX_SAMPLES = 1000
_DEFAULT_CONFIG = "rl_coding.py"


def define_flags(fv: flags.FlagValues, argv: list[str] | None = None) -> None:
  """The command's flags; `argv`: the command line the `--config.` overrides are read from
  (None: sys.argv)."""
  flags.DEFINE_string(
    "checkpoint", None, "checkpoint directory (module docstring)", required=True, flag_values=fv
  )
  flags.DEFINE_string(
    "tasks", "", "task JSONL or micro:START:STOP ('': the config's env.tasks)", flag_values=fv
  )
  flags.DEFINE_integer(
    "k", 1, "largest k of pass@k", lower_bound=1, upper_bound=MAX_SAMPLES, flag_values=fv
  )
  flags.DEFINE_integer(
    "samples",
    0,
    "episodes per task (0: k)",
    lower_bound=0,
    upper_bound=MAX_SAMPLES,
    flag_values=fv,
  )
  flags.register_multi_flags_validator(
    ["k", "samples"],
    lambda v: not v["samples"] or v["samples"] >= v["k"],
    message="--samples must be 0 (= k) or >= --k",
    flag_values=fv,
  )
  flags.DEFINE_enum(
    "split", "heldout", ["heldout", "train", "all"], "the tasks evaluated", flag_values=fv
  )
  flags.DEFINE_string("out", "", "output directory ('': <checkpoint>/eval)", flag_values=fv)
  cli.check_out("out", fv)
  flags.DEFINE_integer(
    "batch", 8, "episodes per policy call", lower_bound=1, upper_bound=4096, flag_values=fv
  )
  flags.DEFINE_integer("seed", 0, "sampling seed", lower_bound=0, flag_values=fv)
  config_flags.DEFINE_config_file(
    "config",
    os.path.join(CONFIG_DIR, _DEFAULT_CONFIG),
    "Settings for a checkpoint without a coding run config (module docstring).",
    flag_values=fv,
    lock_config=True,
    sys_argv=argv,
  )


def _tuples(value):
  """A saved (JSON) run config's lists as the tuples the config files hold."""
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def settings(
  saved: dict, file_config: ml_collections.ConfigDict, overrides: dict, file_given: bool = False
) -> ml_collections.ConfigDict:
  """The run config eval plays with (module docstring), but for its model: `saved` (a
  checkpoint's run config) when it is a coding run's, else `file_config` (the `--config`
  file's; `file_given`: named on the command line), with the `overrides` outside `model`
  (`{'env.max_turns': 5, ...}`, as config flags parsed them); `with_model` adds the model.

  Raises:
    ValueError: one line: a coding run config and a `--config` file both given, an override
      naming a field the config lacks or of another type.
  """
  coding = saved.get("env", {}).get("name") == "coding"
  if coding and file_given:
    raise ValueError(
      "--config=FILE: the checkpoint holds a coding run's config, the settings eval plays "
      "with; change fields with --config.SECTION.FIELD=VALUE"
    )
  c = ml_collections.ConfigDict(_tuples(saved) if coding else file_config.to_dict())
  c.env.curriculum.min_rollouts = 0  # every task is played --samples times
  _override(c, {k: v for k, v in overrides.items() if not k.startswith("model.")})
  base.check_numbers(c)  # the run config's one range table
  return c


def _override(c: ml_collections.ConfigDict, overrides: dict) -> None:
  c.lock()
  try:
    c.update_from_flattened_dict(overrides)
  except (KeyError, AttributeError, TypeError) as e:
    raise ValueError(f"config override: {str(e).splitlines()[0]}") from None


def with_model(
  c: ml_collections.ConfigDict, model_cfg: model_config.ModelConfig, overrides: dict
) -> model_config.ModelConfig:
  """Sets `c.model` to the checkpoint's `model_cfg` with the `model.` `overrides`; returns
  the model config the policy runs with.

  Raises:
    ValueError: one line: an override that changes the architecture (the checkpoint's
      parameters would not fit it), a field the model lacks.
  """
  with c.unlocked():
    c.model = model_config.as_config(model_cfg)
  _override(c, {k: v for k, v in overrides.items() if k.startswith("model.")})
  used = model_config.model_config(c.model)
  diffs = checkpointing.model_config_diff(model_cfg, used)
  if diffs:
    raise ValueError(
      f"--config.model overrides change the checkpoint's architecture: {', '.join(diffs)}; "
      "only runtime fields (dtype, kernels, remat) can change"
    )
  return used


def _tasks(spec: str, config, which: str) -> list:
  env = config.env
  tasks = program.load_tasks(spec, env.workers)
  if which == "all":
    return tasks
  train, held = split.split_by_project(tasks, env.heldout_fraction, env.split_seed)
  chosen = held if which == "heldout" else train
  if not chosen:
    raise ValueError(
      f"the {which} split of {spec} is empty (projects: "
      f"{sorted({split.project_of(t) for t in tasks})}, env.heldout_fraction "
      f"{env.heldout_fraction}); change it (--config.env.heldout_fraction=F) "
      "or use --split=all"
    )
  return chosen


def evaluate_checkpoint(f: flags.FlagValues) -> int:
  """The command on parsed flags `f`: its exit status (module docstring)."""
  try:  # A config file that fails to load does so here (config flags load it lazily).
    file_config = f.config
    file_config.keys()
  except Exception as e:
    print(f"error: {config_error(sys.argv, e, _DEFAULT_CONFIG)}", file=sys.stderr)
    return cli.USAGE_ERROR
  backend.ready_or_exit()  # JAX_PLATFORMS, XLA_FLAGS, JAX_ENABLE_X64, the backend: one line
  try:  # Every input first: nothing below fails after the evaluation.
    out = outputs.check(
      f.out or f"{f.checkpoint}/eval",
      inputs=[f.checkpoint, *([f.tasks] if f.tasks else [])],
      inside_inputs=True,
      replaceable=REPORT_FILES.values(),
    )
    overrides = dict(f["config"].override_values)
    run = settings(
      load_checkpoint.run_config(f.checkpoint),
      file_config,
      overrides,
      file_given=bool(f["config"].present),
    )
    shipped = tok_lib.find_tokenizer_near(f.checkpoint)
    if shipped and "env.tokenizer" not in overrides:
      run.env.tokenizer = shipped
    spec = f.tasks or run.env.tasks
    tasks = _tasks(spec, run, f.split)
    saved_model, variables = load_checkpoint.load(f.checkpoint)
    model_cfg = with_model(run, saved_model, overrides)
    cfg = evaluate.EvalConfig(k=f.k, samples=f.samples, batch=f.batch, seed=f.seed)
    with tempfile.TemporaryDirectory(prefix="cj-eval-") as scratch:  # the tokenizer's copy
      env = program.make_env(run, scratch, tasks)  # the RL program's env; checks lengths
      report = evaluate.evaluate(env, tasks, model_cfg, variables, run.rl, cfg)
  except (OSError, ValueError, bwrap.SandboxUnavailable) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  meta = {
    **{name: f[name].value for name in ("checkpoint", "tasks", "k", "samples", "split", "out")},
    "batch": f.batch,
    "seed": f.seed,
    "tasks_spec": spec,
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


def _explain(argv: list[str], e: BaseException) -> str:
  """One line for a bad flag: the `--config` file's own errors as `experiments.run` words
  them."""
  if isinstance(e, flags.Error) and not str(e).startswith("flag --config="):
    return str(e).strip().splitlines()[0]
  return config_error(argv, e, _DEFAULT_CONFIG)


def run(argv: list[str]) -> int:
  """The command in-process on `argv` (flags only): its exit status (`cli.run`)."""
  full = ["eval", *argv]
  return cli.run(functools.partial(define_flags, argv=full), evaluate_checkpoint, argv, _explain)


_parse_flags = cli.parse_flags(define_flags, _explain)  # app.run's (and docs_commands_test's)

if __name__ == "__main__":
  cli.start(define_flags, evaluate_checkpoint, _explain)
