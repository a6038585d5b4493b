"""The coding-agent RL program: `CodingEnv` on a task file, RL + self-distillation via `rl.run`.

make_env(config, workdir)  `envs.coding.agent.env.CodingEnv` over the training split of
                           `config.env.tasks` (a make_tasks JSONL; `train_split`), with
                           the tokenizer of `config.env.tokenizer` and the feedback kinds
                           of `config.rl`
harder_variants(config, workdir)
                           `env.source`'s task generator, prepared once, as the
                           curriculum's `harder` callback (None without a source)
initial_variables(config)  {'params', 'router'}: `train.init_from` (an imported HF
                           checkpoint) or a random init
run(config, workdir)       RL steps (`rl.run.run`: metrics, checkpoints with the
                           curriculum's statistics, bit-for-bit resume), env workers up
                           for the whole run
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import jax
from absl import logging

from composer_jax.codetasks import task
from composer_jax.codetasks import workers as workers_lib
from composer_jax.codetasks.sandbox import bwrap
from composer_jax.codetasks.synthesis import generator, make_tasks, sources, split
from composer_jax.data import tokenizer as tokenizer_lib
from composer_jax.envs.coding.agent import env as agent_env
from composer_jax.envs.coding.agent import tools as agent_tools
from composer_jax.model.config import model_config
from composer_jax.rl import run as rl_run
from composer_jax.rl.programs import update_program
from composer_jax.train import init_from
from experiments.coding import warmup

NO_WARMUP = (
  "warning: warmup.steps=0 and no train.init_from: RL starts from a random init, whose "
  "episodes never pass, so the reward will stay 0; warm up first "
  "(rl_coding.py:micro has warmup.steps=800, or --config.warmup.steps=N) or give "
  "--config.train.init_from=CKPT; the whole experiment: python -m experiments.coding.learn"
)


def load_tokenizer(config, workdir: str):
  """`env.tokenizer`: 'bytes' (the 256 single bytes: vocab 512, for tiny CPU runs), a tiktoken
  file / a directory holding `tiktoken.model` (Kimi's), or '': the `tiktoken.model` beside the
  imported checkpoint `train.init_from` (the pod setting). Either is kept as the workdir's own
  `tiktoken.model`, where `python -m experiments.eval --checkpoint WORKDIR` finds it."""
  name = config.env.tokenizer
  if name == "" and config.train.init_from:
    name = tokenizer_lib.find_tokenizer_near(config.train.init_from) or ""
    if not name:
      raise ValueError(
        f"env.tokenizer='': train.init_from={config.train.init_from!r} has no "
        f"{tokenizer_lib.TIKTOKEN_FILENAME}; give --config.env.tokenizer=FILE"
      )
  if name in ("", "byte"):
    raise ValueError(f"env.tokenizer={name!r}: the chat format needs 'bytes' or a tiktoken file")
  os.makedirs(workdir, exist_ok=True)
  own = os.path.join(workdir, tokenizer_lib.TIKTOKEN_FILENAME)
  if name == "bytes":
    tokenizer_lib.write_byte_ranks(own)
  else:
    tok = tokenizer_lib.load_tokenizer({"tokenizer": name})  # one line for a bad path
    if os.path.abspath(tok.path) != os.path.abspath(own):
      shutil.copyfile(tok.path, own + ".partial")
      os.replace(own + ".partial", own)
  return tokenizer_lib.load_tokenizer({"tokenizer": own})


def load_tasks(spec: str, workers: int = 1) -> list[task.Task]:
  """The tasks of `spec`: a make_tasks JSONL, or `micro:START:STOP` (micro-projects of those
  seeds, made on first use in the task cache: `make_tasks.micro_tasks`). One-line ValueError
  for a missing, unreadable or empty file."""
  path = spec
  if spec.startswith("micro:"):
    cache = sources.CACHE.parent / "micro_tasks"
    path = str(
      make_tasks.micro_tasks(spec.removeprefix("micro:"), cache, workers_lib.Pool(workers))
    )
  if not path or not os.path.isfile(path):
    raise ValueError(
      f"env.tasks={path!r} is not a file; give a make_tasks JSONL or micro:START:STOP"
    )
  try:
    tasks = task.load_jsonl(path)  # every record checked: one line naming the bad one
  except ValueError as e:
    raise ValueError(f"env.tasks={path!r} is not a task JSONL: {e}") from None
  if not tasks:
    raise ValueError(f"env.tasks={path!r} holds no tasks")
  return tasks


def train_split(config, tasks: list[task.Task]) -> list[task.Task]:
  """The tasks RL may train on: those of the projects `codetasks.synthesis.split` does not hold out
  (`env.heldout_fraction`, `env.split_seed`; `python -m experiments.eval` evaluates the
  held-out projects with the same function and values)."""
  e = config.env
  train, held = split.split_by_project(tasks, e.heldout_fraction, e.split_seed)
  projects = lambda ts: len({split.project_of(t) for t in ts})
  if not train:
    raise ValueError(
      f"env.tasks={e.tasks!r}: all {projects(held)} projects are held out at "
      f"env.heldout_fraction={e.heldout_fraction} (env.split_seed={e.split_seed}); "
      "RL trains only on the other projects: lower the fraction or add projects"
    )
  logging.info(
    "RL tasks: %d of %d projects (%d tasks); held out for eval: %d projects (%d tasks)",
    projects(train),
    projects(tasks),
    len(train),
    projects(held),
    len(held),
  )
  return train


def harder_variants(config, workdir: str):
  """`generator.Generator.harder` over `env.source` (a project directory, sdist or pinned
  `name==version`: where the tasks came from; `env.source_options`: `generator.Config` fields,
  as the tasks were made), or None when it is ''. Its baseline and coverage
  map are cached under `<workdir>/generator`, so a resumed run makes the same variants."""
  if not config.env.source:
    return None
  work = Path(workdir) / "generator"
  shutil.rmtree(work / "src", ignore_errors=True)  # resolve() copies the source here afresh
  work.mkdir(parents=True, exist_ok=True)
  cfg = generator.Config(seed=config.train.seed, **config.env.source_options.to_dict())
  gen = generator.Generator(
    sources.resolve(config.env.source, work), work, cfg, cache=work / "cache"
  )
  gen.prepare()
  return gen.harder


def make_env(config, workdir: str, tasks=None) -> agent_env.CodingEnv:
  """The env over the training split (or over `tasks`); token lengths left at 0 in
  `config.rl` are derived from its tasks first, and all of them checked (`fit_lengths`)."""
  e, r = config.env, config.rl
  tok = load_tokenizer(config, workdir)
  vocab = model_config(config.model).vocab_size
  if vocab < tok.vocab_size:
    raise ValueError(f"model vocab_size={vocab} < the tokenizer's {tok.vocab_size}")
  curriculum = None  # min_rollouts 0: off; max_active 0: every task active
  if e.curriculum.min_rollouts:
    curriculum = {**e.curriculum.to_dict(), "max_active": e.curriculum.max_active or None}
  env = agent_env.CodingEnv(
    tasks if tasks is not None else train_split(config, load_tasks(e.tasks, e.workers)),
    tok,
    budget=_budget(e, 1 << 30),
    tools=tuple(e.tools),  # rl.seq_len: fit_lengths
    max_turn_tokens=r.max_new_tokens,
    feedback_kinds=tuple(r.feedback_kinds),
    feedback_options=r.feedback_options.to_dict(),
    workers=e.workers,
    backend=e.backend,
    curriculum=curriculum,
    harder=harder_variants(config, workdir) if curriculum else None,
    max_hint_tokens=e.max_hint_tokens,
    thinking=e.thinking,
    statement=e.statement,
    **({"system": e.system} if e.system else {}),
  )
  fit_lengths(config, env)
  env.budget = _budget(e, r.seq_len)
  env.episode_log = os.path.join(workdir, "episodes.jsonl")  # per RL batch: task ids, flags
  return env


def _budget(e, max_tokens: int) -> agent_tools.Budget:
  return agent_tools.Budget(
    max_turns=e.max_turns,
    max_tokens=max_tokens,
    wall_s=e.wall_s,
    output_chars=e.output_chars,
    command=bwrap.Limits(cpu_s=int(e.command_s), wall_s=e.command_s, log_bytes=256 << 10),
  )


def fit_lengths(config, env: agent_env.CodingEnv) -> None:
  """Derives the token lengths left at 0 from the env's tasks, then checks every length, one
  line each, before anything is compiled:

    rl.seq_len          the episode budget; 0: the longest first prompt (tool declarations,
                        system, statement) + env.max_turns * rl.max_new_tokens
    rl.prompt_len       the sampler's prompt buffer (>= rl.seq_len - rl.max_new_tokens); 0:
                        rl.seq_len
    rl.teacher_seq_len  teacher rows, history + hint + turn (>= rl.seq_len +
                        env.max_hint_tokens); 0: that. With rl.teacher_prefix_reuse the rows
                        hold 1 + hint + turn (>= 1 + env.max_hint_tokens + rl.max_new_tokens)
  and rl.seq_len >= the longest prompt + rl.max_new_tokens (a first turn fits); the model's
  max_position_embeddings covers the sampler (prompt_len + max_new_tokens - 1) and the teacher.
  """
  r, hint = config.rl, env.max_hint_tokens
  longest = max(env.prompt_tokens(t) for t in env.tasks.values())
  r.seq_len = r.seq_len or longest + config.env.max_turns * r.max_new_tokens
  r.prompt_len = r.prompt_len or r.seq_len
  teacher = 1 + hint + r.max_new_tokens if r.teacher_prefix_reuse else r.seq_len + hint
  r.teacher_seq_len = r.teacher_seq_len or teacher
  logging.info(
    "token lengths: longest first prompt %d, rl.seq_len %d, rl.prompt_len %d, "
    "rl.max_new_tokens %d, rl.teacher_seq_len %d",
    longest,
    r.seq_len,
    r.prompt_len,
    r.max_new_tokens,
    r.teacher_seq_len,
  )
  if r.seq_len < longest + r.max_new_tokens:
    raise ValueError(
      f"rl.seq_len={r.seq_len} < the longest first prompt ({longest} tokens) + "
      f"rl.max_new_tokens={r.max_new_tokens}: raise it (0 derives it)"
    )
  if r.prompt_len < r.seq_len - r.max_new_tokens:
    raise ValueError(
      f"rl.prompt_len={r.prompt_len} must be >= rl.seq_len - rl.max_new_tokens "
      f"({r.seq_len - r.max_new_tokens}): the env's token budget is rl.seq_len"
    )
  if r.teacher_seq_len < teacher:
    raise ValueError(
      f"rl.teacher_seq_len={r.teacher_seq_len} < {teacher}, a teacher row's "
      f"longest ({'1 + ' if r.teacher_prefix_reuse else 'rl.seq_len + '}"
      f"env.max_hint_tokens={hint}{' + rl.max_new_tokens' * r.teacher_prefix_reuse}"
      "): raise it or set it to 0 (derived)"
    )
  positions = model_config(config.model).max_position_embeddings
  teacher_stream = r.seq_len + r.teacher_seq_len if r.teacher_prefix_reuse else r.teacher_seq_len
  need = max(r.prompt_len + r.max_new_tokens - 1, r.seq_len, teacher_stream)
  if need > positions:
    raise ValueError(
      f"the model's max_position_embeddings={positions} < {need} tokens, the "
      f"longest sequence these lengths make (rl.seq_len={r.seq_len}, prompt_len="
      f"{r.prompt_len} + max_new_tokens={r.max_new_tokens} - 1, teacher_seq_len="
      f"{r.teacher_seq_len}): lower them or raise model."
      "max_position_embeddings (a random init only)"
    )


def initial_variables(config) -> dict:
  """{'params', 'router'} of `train.init_from`, else of a random init (seed `train.seed`)."""
  model_cfg = model_config(config.model)
  progs = update_program(config, model_cfg).progs
  variables = None
  if config.train.init_from:
    target = {"params": progs.target.params, "router": progs.target.router}
    variables = init_from.load(config.train.init_from, model_cfg, target)
  state = progs.init(jax.random.PRNGKey(config.train.seed), variables)
  return {"params": state.params, "router": state.router}


def run(config, workdir: str) -> list[dict]:
  """The supervised warm-up (`warmup.steps` > 0: `experiments/coding/warmup.py`, in
  `<workdir>/warmup`), then, unless `warmup.only`, RL on coding episodes in `workdir`; both
  resume from their newest checkpoints. Without either a warm-up or `train.init_from` it says
  first, on stderr, that the reward will stay 0 (a random policy never writes a passing
  patch) and how to warm up."""
  if not config.warmup.steps and not config.train.init_from:
    print(NO_WARMUP, file=sys.stderr, flush=True)
  env = make_env(config, workdir)  # derives the token lengths left at 0 from the tasks
  rl_run.validate(config)
  with env:
    if config.warmup.steps:  # from train.init_from or a random init
      init = warmup.warmup(config, workdir, env, list(env.tasks.values()))
      if config.warmup.only:
        return []
    else:
      init = initial_variables(config)
    return rl_run.run(config, workdir, env, init)
