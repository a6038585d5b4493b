"""The coding-agent RL program: `CodingEnv` on a task file, RL + self-distillation via `rl.run`.

    make_env(config, workdir)  `envs.coding.agent_env.CodingEnv` over the training split of
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
from pathlib import Path

import jax
from absl import logging

from composer_jax.data import tokenizer as tokenizer_lib
from composer_jax.envs.coding import (
  agent_env,
  agent_tools,
  generator,
  sandbox,
  sources,
  split,
  task,
)
from composer_jax.rl import run as rl_run
from composer_jax.rl import train as rl_train
from composer_jax.train import init_from, loop


def load_tokenizer(config, workdir: str):
  """`env.tokenizer`: 'bytes' (a 256-byte tiktoken file written in the workdir: vocab 512, for
  tiny CPU runs) or a tiktoken file / a directory holding `tiktoken.model` (Kimi's)."""
  name = config.env.tokenizer
  if name == "bytes":
    os.makedirs(workdir, exist_ok=True)
    name = tokenizer_lib.write_byte_ranks(os.path.join(workdir, "bytes.tiktoken"))
  if name in ("", "byte"):
    raise ValueError(f"env.tokenizer={name!r}: the chat format needs 'bytes' or a tiktoken file")
  return tokenizer_lib.load_tokenizer({"tokenizer": name})


def load_tasks(path: str) -> list[task.Task]:
  """The tasks of a make_tasks JSONL; one-line ValueError for a missing, unreadable or empty
  file."""
  if not path or not os.path.isfile(path):
    raise ValueError(f"env.tasks={path!r} is not a file; give a make_tasks JSONL")
  try:
    tasks = task.read_jsonl(path)
  except (ValueError, TypeError, UnicodeDecodeError) as e:
    raise ValueError(f"env.tasks={path!r} is not a task JSONL: {e}") from None
  if not tasks:
    raise ValueError(f"env.tasks={path!r} holds no tasks")
  return tasks


def train_split(config, tasks: list[task.Task]) -> list[task.Task]:
  """The tasks RL may train on: those of the projects `envs.coding.split` does not hold out
  (`env.heldout_fraction`, `env.split_seed`; `python -m experiments.eval` evaluates the
  held-out projects with the same function and values)."""
  e = config.env
  train, held = split.split_by_project(tasks, e.heldout_fraction, e.split_seed)
  projects = lambda ts: len({split.project_of(t) for t in ts})
  if not train:
    raise ValueError(f"env.tasks={e.tasks!r}: all {projects(held)} projects are held out at "
                     f"env.heldout_fraction={e.heldout_fraction} (env.split_seed={e.split_seed}); "
                     "RL trains only on the other projects: lower the fraction or add projects")
  logging.info("RL tasks: %d of %d projects (%d tasks); held out for eval: %d projects (%d "
               "tasks)", projects(train), projects(tasks), len(train), projects(held), len(held))
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
  gen = generator.Generator(sources.resolve(config.env.source, work), work, cfg,
                            cache=work / "cache")
  gen.prepare()
  return gen.harder


def make_env(config, workdir: str) -> agent_env.CodingEnv:
  e, r = config.env, config.rl
  tok = load_tokenizer(config, workdir)
  vocab = loop.model_config(config).vocab_size
  if vocab < tok.vocab_size:
    raise ValueError(f"model vocab_size={vocab} < the tokenizer's {tok.vocab_size}")
  if r.prompt_len < r.seq_len - r.max_new_tokens:
    raise ValueError(f"rl.prompt_len={r.prompt_len} must be >= rl.seq_len - rl.max_new_tokens "
                     f"({r.seq_len - r.max_new_tokens}): the env's token budget is rl.seq_len")
  budget = agent_tools.Budget(
    max_turns=e.max_turns, max_tokens=r.seq_len, wall_s=e.wall_s, output_chars=e.output_chars,
    command=sandbox.Limits(cpu_s=int(e.command_s), wall_s=e.command_s, log_bytes=256 << 10),
  )
  curriculum = None  # min_rollouts 0: off; max_active 0: every task active
  if e.curriculum.min_rollouts:
    curriculum = {**e.curriculum.to_dict(), "max_active": e.curriculum.max_active or None}
  return agent_env.CodingEnv(
    train_split(config, load_tasks(e.tasks)), tok, budget=budget, tools=tuple(e.tools),
    max_turn_tokens=r.max_new_tokens, feedback_kinds=tuple(r.feedback_kinds),
    feedback_options=r.feedback_options.to_dict(), workers=e.workers, backend=e.backend,
    curriculum=curriculum, harder=harder_variants(config, workdir) if curriculum else None,
  )


def initial_variables(config) -> dict:
  """{'params', 'router'} of `train.init_from`, else of a random init (seed `train.seed`)."""
  progs = rl_train.update_program(config, loop.model_config(config)).progs
  variables = None
  if config.train.init_from:
    target = {"params": progs.target.params, "router": progs.target.router}
    variables = init_from.load(config.train.init_from, loop.model_config(config), target)
  state = progs.init(jax.random.PRNGKey(config.train.seed), variables)
  return {"params": state.params, "router": state.router}


def run(config, workdir: str) -> list[dict]:
  """RL on coding episodes in `workdir` (resumes from its newest checkpoint)."""
  rl_run.validate(config)
  env = make_env(config, workdir)
  with env:
    return rl_run.run(config, workdir, env, initial_variables(config))
