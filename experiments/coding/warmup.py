"""The coding agent's supervised warm-up on oracle episodes, run by the training driver.

    warmup(config, workdir, env, tasks[, init]) -> {'params', 'router'}

Examples: each training task's scripted episode (`agent_scripts.oracle_trajectory`: the oracle
turn, short `append` calls when the env offers them, played through the env's real harness, its
observation, then `submit`), in the
Kimi K2.5 format the env renders; the loss is on the assistant's tokens only (`loss_mask` =
the policy's tokens). Step i trains on `warmup.batch_size` examples drawn by
`np.random.default_rng([train.seed, i])`, so the data position is the step itself.

Run by `train.loop.drive` in `<workdir>/warmup` (a link to one directory lets runs share it): metrics (`metrics.jsonl`, console, TensorBoard),
checkpoints every `warmup.ckpt_every` steps and at the end, and a rerun resumes from the newest
one bit for bit (a finished warm-up is restored, not recomputed). Every `warmup.check_every`
steps (and at the end) the policy writes the first turn of `warmup.check_tasks` training tasks
greedily: `check/malformed` is the fraction that does not parse as tool calls, `check/exact` the
fraction equal to the oracle's turn token for token (well-formedness while it learns).
"""

from __future__ import annotations

import os

import jax
import ml_collections
import numpy as np

from composer_jax import chat
from composer_jax.envs.coding.agent import scripts as agent_scripts
from composer_jax.rl import rollout
from composer_jax.rl.trajectory import pack_batch
from composer_jax.train import checkpointing, loop, placement, programs
from experiments.tool_feedback.program import warmup_config


def batch(examples, config, step: int, pad_id: int) -> dict[str, np.ndarray]:
  """Step `step`'s batch: `warmup.batch_size` of `examples` (trajectories) drawn by
  `default_rng([train.seed, step])`, packed to `warmup.seq_len`; `loss_mask` = the policy's
  tokens."""
  w = config.warmup
  rng = np.random.default_rng([config.train.seed, step])
  picked = [examples[i] for i in rng.integers(len(examples), size=w.batch_size)]
  packed = pack_batch(picked, [w.seq_len], pad_id=pad_id)
  keys = ("tokens", "targets", "segment_ids", "positions")
  return {k: packed[k] for k in keys} | {"loss_mask": packed["model_mask"].astype(np.float32)}


class _Warmup:
  """The warm-up `train.loop.Program` (module docstring)."""

  def __init__(self, config, progs, model_cfg, env, examples, checks):
    self._c, self._w, self._progs, self._env = config, config.warmup, progs, env
    self._examples, self._checks = examples, checks
    sampling = ml_collections.ConfigDict(
      dict(max_new_tokens=config.rl.max_new_tokens, temperature=0.0, top_p=1.0))
    self._policy = rollout.make_policy(model_cfg, sampling, env.stop_ids, env.pad_id)

  def step(self, state, step):
    data = batch(self._examples, self._c, step, self._env.pad_id)
    data = {k: v[None] for k, v in data.items()}
    return self._progs.train_step(
      state, placement.to_global(data, self._progs.train_batch_sharding, whole=True))

  def check(self, state) -> dict[str, float]:
    """Greedy first turns of the check tasks: malformed and exact fractions."""
    firsts = [self._env.reset(t)[1] for t, _ in self._checks]
    prompts = np.full((len(firsts), max(map(len, firsts))), self._env.pad_id, np.int32)
    for b, ids in enumerate(firsts):
      prompts[b, :len(ids)] = ids
    lens = np.array([len(f) for f in firsts], np.int32)
    variables = {"params": state.params, "router": state.router}
    tokens, _, lengths = self._policy(variables, prompts, lens, jax.random.key(0))
    malformed = exact = 0
    for (_, want), row, n in zip(self._checks, tokens, lengths, strict=True):
      ids = row[:n].tolist()
      parsed = chat.parse_assistant(self._env.prefill + self._env.tokenizer.decode(ids))
      malformed += parsed.error is not None or not parsed.tool_calls
      exact += ids == want
    n = len(self._checks)
    return {"check/malformed": malformed / n, "check/exact": exact / n}

  def record(self, step, metrics, state):
    w, record = self._w, {}
    if step % w.log_every == 0 or step == w.steps:
      record.update(metrics())
    if self._checks and (step % w.check_every == 0 or step == w.steps):
      record.update(self.check(state))
    return {"step": step, **record} if record else None

  def checkpoint(self, state):
    return state, {}  # the data position is the step


def validate(config) -> None:
  """One-line ValueErrors for warm-up settings that cannot work."""
  w = config.warmup
  for name in ("batch_size", "seq_len", "log_every", "ckpt_every", "check_every"):
    if w[name] < 1:
      raise ValueError(f"warmup.{name}={w[name]} must be >= 1")
  if w.steps < 0 or w.check_tasks < 0:
    raise ValueError(f"warmup.steps={w.steps} and warmup.check_tasks={w.check_tasks} must be "
                     ">= 0")


def warmup(config, workdir: str, env, tasks, init: dict | None = None) -> dict:
  """{'params', 'router'} after `warmup.steps` supervised steps on `tasks`' oracle episodes
  in `<workdir>/warmup` (resumed, or restored when finished; module docstring), starting from
  `init` ({'params', 'router'}, e.g. an imported checkpoint) or a random init."""
  validate(config)
  w = config.warmup
  model_cfg = loop.model_config(config)
  examples = [agent_scripts.oracle_trajectory(env, t) for t in tasks]
  longest = max(len(e.tokens) for e in examples)
  if longest > w.seq_len:
    raise ValueError(f"warmup.seq_len={w.seq_len} is shorter than the longest oracle episode "
                     f"({longest} tokens); raise it (and rl.seq_len)")
  thinking = env.prefill == chat.prefill(True)
  oracle = agent_scripts.append_calls if "append" in env.tools else agent_scripts.oracle_calls
  checks = [(t, agent_scripts.turn_ids(env.tokenizer, oracle(t), thinking=thinking))
            for t in tasks[:w.check_tasks]]
  progs = programs.programs(warmup_config(config), model_cfg)
  directory = os.path.join(workdir, "warmup")
  ckpt = checkpointing.Checkpointer(directory, keep=w.keep)
  state = loop.restore_newest(model_cfg, ckpt, lambda step: ckpt.restore(step, progs.target),
                              directory)
  if state is None:
    state = progs.init(jax.random.PRNGKey(config.train.seed), init)
  program = _Warmup(config, progs, model_cfg, env, examples, checks)
  if int(state.step) < w.steps:
    loop.drive(program, state, int(state.step), ckpt, workdir=directory, total_steps=w.steps,
               ckpt_every=w.ckpt_every, console_every=w.log_every, model_cfg=model_cfg,
               run_config=config.to_dict())
    ckpt = checkpointing.Checkpointer(directory, keep=w.keep)
    state = loop.restore_newest(model_cfg, ckpt, lambda step: ckpt.restore(step, progs.target),
                                directory)
  ckpt.close()
  if int(state.step) < w.steps:
    raise RuntimeError(f"the warm-up stopped at step {int(state.step)} of {w.steps} (a stop "
                       "signal); run again to resume it")
  return {"params": state.params, "router": state.router}
