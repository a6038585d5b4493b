"""The coding agent's supervised warm-up on oracle episodes: the one supervised loop
(`train.loop.trained_variables`) on scripted episodes (`rl.scripted`).

    warmup(config, workdir, env, tasks) -> {'params', 'router'}

Examples: each training task's scripted episode (`agent_scripts.oracle_trajectory`: the oracle
turn, short `append` calls when the env offers them, played through the env's real harness, its
observation, then `submit`), in the Kimi K2.5 format the env renders; the loss is on the
assistant's tokens only (`loss_mask` = the policy's tokens). A batch is `warmup.batch_size`
examples drawn one after another from `default_rng([train.seed, 0])` (its state is
checkpointed with the run's).

A run of its own in `<workdir>/warmup` (`rl.scripted.warmup_config`; a link to one directory
lets runs share it), from `train.init_from` or a random init: metrics (`metrics.jsonl`,
console, TensorBoard), checkpoints every `warmup.ckpt_every` steps and at the end, and a rerun
resumes from the newest one bit for bit (a finished warm-up is read back, not recomputed).
Every `warmup.check_every` steps (and at the end) the policy writes the first turn of
`warmup.check_tasks` training tasks greedily: `check/malformed` is the fraction that does not
parse as tool calls, `check/exact` the fraction equal to the oracle's turn token for token
(well-formedness while it learns).
"""

from __future__ import annotations

import os

import jax
import ml_collections
import numpy as np

from composer_jax import chat
from composer_jax.envs.coding.agent import scripts as agent_scripts
from composer_jax.model.config import model_config
from composer_jax.rl import rollout, scripted
from composer_jax.train import compile_cache, loop


def batches(examples, config, pad_id: int) -> scripted.EpisodeBatches:
  """[warmup.batch_size, warmup.seq_len] batches of `examples` (trajectories) drawn from
  `default_rng([train.seed, 0])`."""
  w = config.warmup
  return scripted.EpisodeBatches(
    lambda rng: examples[rng.integers(len(examples))],
    np.random.default_rng([config.train.seed, 0]),
    batch_size=w.batch_size,
    seq_len=w.seq_len,
    pad_id=pad_id,
  )


class _Check:
  """`state -> {'check/malformed', 'check/exact'}`: greedy first turns of `checks`
  ([(task, oracle turn ids)]) (module docstring)."""

  def __init__(self, config, env, checks):
    self._env, self._checks = env, checks
    sampling = ml_collections.ConfigDict(
      dict(max_new_tokens=config.rl.max_new_tokens, temperature=0.0, top_p=1.0)
    )
    self._policy = rollout.make_policy(
      model_config(config.model), sampling, env.stop_ids, env.pad_id
    )

  def __call__(self, state) -> dict[str, float]:
    firsts = [self._env.reset(t)[1] for t, _ in self._checks]
    prompts = np.full((len(firsts), max(map(len, firsts))), self._env.pad_id, np.int32)
    for b, ids in enumerate(firsts):
      prompts[b, : len(ids)] = ids
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


def validate(config) -> None:
  """One-line ValueErrors for warm-up settings that cannot work."""
  w = config.warmup
  for name in ("batch_size", "seq_len", "log_every", "ckpt_every", "check_every"):
    if w[name] < 1:
      raise ValueError(f"warmup.{name}={w[name]} must be >= 1")
  if w.steps < 0 or w.check_tasks < 0:
    raise ValueError(f"warmup.steps={w.steps} and warmup.check_tasks={w.check_tasks} must be >= 0")
  try:
    loop.validate(scripted.warmup_config(config))
  except ValueError as e:
    raise ValueError(f"the warm-up's {e}") from None


def warmup(config, workdir: str, env, tasks) -> dict:
  """{'params', 'router'} after `warmup.steps` supervised steps on `tasks`' oracle episodes
  in `<workdir>/warmup` (resumed, or read back when finished; module docstring)."""
  validate(config)
  w = config.warmup
  examples = [agent_scripts.oracle_trajectory(env, t) for t in tasks]
  longest = max(len(e.tokens) for e in examples)
  if longest > w.seq_len:
    raise ValueError(
      f"warmup.seq_len={w.seq_len} is shorter than the longest oracle episode "
      f"({longest} tokens); raise it (and rl.seq_len)"
    )
  thinking = env.prefill == chat.prefill(True)
  oracle = agent_scripts.append_calls if "append" in env.tools else agent_scripts.oracle_calls
  checks = [
    (t, agent_scripts.turn_ids(env.tokenizer, oracle(t), thinking=thinking))
    for t in tasks[: w.check_tasks]
  ]
  run = scripted.warmup_config(config)
  # The RL run's compile cache (one directory per process: the first one set is used).
  run.train.compile_cache_dir = (
    compile_cache.cache_dir(config.train.compile_cache_dir, workdir) or compile_cache.OFF
  )
  data = scripted.data(
    batches(examples, config, env.pad_id), evaluate=_Check(config, env, checks) if checks else None
  )
  return loop.trained_variables(run, os.path.join(workdir, "warmup"), data)
