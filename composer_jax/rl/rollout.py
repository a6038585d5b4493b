"""Rollouts: one RL batch sampled on the sampler's mesh, and the disaggregated sampler thread.

`RolloutWorker.rollout(k, rng)` plays batch k: `groups` tasks drawn from `rng`, each played
`group_size` times (GRPO groups) by the decoder (`rl.decode`, temperature/top-p from the
config) through `rl.episodes.run_episodes` with key `fold_in(key, k)`; the trajectories packed
(`rl.trajectory.pack_batch`, one static length); the environment's feedback (`Env.feedback`)
flags faulty model turns with hints, and with sd_coef > 0 they become the teacher batch
(`rl.teacher.build_teacher_batch`, `teacher_rows` rows: extra targets are dropped and counted)
after the SD variant picks and extends them (`rl.sd_variants`), followed by `rl.gap_rows`
probe-only rows of the teacher gap (`rl.sd_probes.gap_targets`, also without SD);
with `loss.turn_penalty` > 0 they mark the tokens the per-turn penalty acts on
(`batch['flagged_mask']`, `rl.trajectory.turn_token_mask`).
It samples with the weights last given to `RolloutWorker.push`, which reshards them from the training
layout to the sampling layout (`rl.mesh.SamplerMesh`).

Modes (`rl.mode`):
  colocated       sample batch k with the weights after k optimizer steps, then train on it,
                  on the same devices;
  disaggregated   `AsyncRolloutWorker`: a thread samples on its own devices while the trainer
                  trains; batch k is sampled with the weights after max(k - s, k0) steps
                  (s = `rl.max_staleness`, k0 the step the run (re)started from), so with s = 1
                  the sampler plays batch k + 1 with the weights of step k while the trainer
                  trains on batch k. The trainer pushes its weights after each step. With
                  s = 0 the two take turns and the run equals the colocated one.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any

import jax
import numpy as np

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig
from composer_jax.rl import advantages, decode, sd_probes, sd_variants
from composer_jax.rl.config import RANGES
from composer_jax.rl.env import Env, distill_targets
from composer_jax.rl.episodes import Episode, run_episodes
from composer_jax.rl.mesh import SamplerMesh
from composer_jax.rl.teacher import build_teacher_batch
from composer_jax.rl.trajectory import pack_batch, turn_token_mask
from composer_jax.train.config import check_ranges


@dataclasses.dataclass
class Rollout:
  """Batch `step`, sampled with the weights after `version` optimizer steps.

  `batch` / `teacher_batch` are host arrays (`teacher_batch` None without SD); `row` holds
  the episode metrics; `rng_state` is the task generator's state after this batch's tasks.
  """

  step: int
  version: int
  episodes: list[Episode]
  batch: dict[str, np.ndarray]
  teacher_batch: dict[str, np.ndarray] | None
  row: dict[str, float]
  rng_state: dict


def empty_teacher_batch(
  rows: int, length: int, slots: int, reuse_prefix: bool = False
) -> dict[str, np.ndarray]:
  """A teacher batch of padding rows only (all slot_mask 0): the SD term and its gradient are 0,
  so steps without flagged turns run the same compiled update (with `reuse_prefix`, the
  prefix-reuse layout's, `prefix_len` included)."""
  i32 = lambda *s: np.zeros(s, np.int32)
  extra = {"prefix_len": i32(rows)} if reuse_prefix else {}
  return dict(
    **extra,
    tokens=i32(rows, length),
    targets=i32(rows, length),
    positions=i32(rows, length),
    segment_ids=i32(rows, length),
    student_row=i32(rows),
    target_turn=np.full((rows,), -1, np.int32),
    dropped_tokens=i32(rows),
    slot_student_pos=i32(rows, slots),
    slot_teacher_pos=i32(rows, slots),
    slot_target=i32(rows, slots),
    slot_mask=np.zeros((rows, slots), np.float32),
  )


def check_sampling(rl_cfg) -> None:
  """One-line ValueErrors for `rl.temperature` / `rl.top_p` the sampler cannot use (a NaN
  temperature samples garbage without an error): their `rl.config.RANGES`."""
  check_ranges({"rl": rl_cfg}, {k: RANGES[k] for k in ("rl.temperature", "rl.top_p")})


def make_policy(
  model_cfg: ModelConfig,
  rl_cfg,
  stop_ids: tuple[int, ...],
  pad_id: int,
  mesh: SamplerMesh | None = None,
):
  """`policy(variables, prompts [B, P], prompt_lens [B], key) -> (tokens, logprobs, lengths)`
  (host arrays); with `mesh`, the prompts are placed on it (`SamplerMesh.put_rows`) and the
  outputs gathered from it (`SamplerMesh.to_host`), else on the default device.

  Raises:
    ValueError: `rl_cfg`'s temperature or top_p cannot be sampled with (`check_sampling`).
  """
  check_sampling(rl_cfg)
  if model_cfg.moe_dispatch == "expert_parallel":  # decoding runs without the trainer's mesh
    model_cfg = model_cfg.replace(moe_dispatch="dropless")
  put_rows, to_host = (np.asarray, np.asarray) if mesh is None else (mesh.put_rows, mesh.to_host)

  def policy(variables, prompts, prompt_lens, key):
    out = decode.sample(
      model_cfg,
      variables,
      put_rows(prompts),
      put_rows(prompt_lens),
      key,
      max_new_tokens=rl_cfg.max_new_tokens,
      temperature=rl_cfg.temperature,
      top_p=rl_cfg.top_p,
      stop_ids=tuple(stop_ids),
      pad_id=pad_id,
    )
    return to_host(out.tokens), to_host(out.logprobs), to_host(out.lengths)

  return policy


class RolloutWorker:
  """Plays RL batches on `mesh` with the weights last pushed (see the module docstring)."""

  def __init__(self, config, env: Env, model_cfg: ModelConfig, mesh: SamplerMesh, router: Any):
    self._config, self._env, self.mesh = config, env, mesh
    self._policy = make_policy(model_cfg, config.rl, env.stop_ids, env.pad_id, mesh)
    self._axes = transformer.logical_axes(model_cfg)
    self._router, _ = mesh.put_weights(router, self._axes["router"])
    self._key = jax.random.fold_in(jax.random.key(config.train.seed), 1)
    self._variables, self._version = None, -1

  def push(self, params: Any, version: int) -> dict[str, float]:
    """Weights after `version` optimizer steps, moved to the sampling layout; returns the
    resharding metrics."""
    params, metrics = self.mesh.put_weights(params, self._axes["params"])
    self._variables, self._version = {"params": params, "router": self._router}, version
    return metrics

  def rollout(self, step: int, rng: np.random.Generator) -> Rollout:
    r, env = self._config.rl, self._env
    t0 = time.perf_counter()
    rows = r.groups * r.group_size
    group_ids = np.repeat(np.arange(r.groups), r.group_size)
    tasks = [env.sample_task(rng) for _ in range(r.groups)]
    rng_state = rng.bit_generator.state
    variables = self._variables
    episodes = run_episodes(
      env,
      [tasks[g] for g in group_ids],
      group_ids,
      lambda p, n, k: self._policy(variables, p, n, k),
      jax.random.fold_in(self._key, step),
      prompt_len=r.prompt_len,
      pad_id=env.pad_id,
    )
    trajs = [e.trajectory for e in episodes]
    batch = pack_batch(trajs, [r.seq_len], batch_size=rows, pad_id=env.pad_id)
    advantages.check_groups(batch["group_index"], batch["valid"], rows)
    targets = distill_targets(env, episodes)
    row = dict(**env.episode_metrics(episodes), flagged_turns=len(targets))
    if self._config.loss.turn_penalty > 0:
      batch["flagged_mask"] = turn_token_mask(
        batch, [(t.trajectory_index, t.turn) for t in targets]
      )
    teacher_batch = self._teacher_batch(trajs, batch, targets, row)
    row["sampler/seconds"] = time.perf_counter() - t0
    return Rollout(step, self._version, episodes, batch, teacher_batch, row, rng_state)

  def _teacher_batch(self, trajs, batch, targets, row: dict) -> dict[str, np.ndarray] | None:
    """Teacher rows: the variant's targets (`rl.sd_variants`, with sd_coef > 0: `teacher_rows`,
    extra ones dropped and counted), then up to `gap_rows` probe-only rows of the teacher gap
    (`sd_probes.gap_targets`, `gap_row` 1); None when there are neither."""
    r, loss = self._config.rl, self._config.loss
    sd_rows = r.teacher_rows if loss.sd_coef > 0 else 0
    if sd_rows + r.gap_rows == 0:
      return None
    kept = []
    if sd_rows:
      chosen = sd_variants.distill_targets(
        loss.sd_variant,
        targets,
        trajs,
        success_reward=r.success_reward,
        demo_tokens=loss.sd_demo_tokens,
      )
      kept = chosen[:sd_rows]
      row.update(flagged_turns_taught=len(chosen), flagged_turns_dropped=len(chosen) - len(kept))
    gaps = sd_probes.gap_targets(targets, trajs, success_reward=r.success_reward, limit=r.gap_rows)
    rows = sd_rows + r.gap_rows
    if kept or gaps:
      out = build_teacher_batch(
        trajs,
        batch,
        kept + gaps,
        buckets=[r.teacher_seq_len],
        turn_buckets=[r.max_new_tokens],
        num_rows=rows,
        pad_id=self._env.pad_id,
        reuse_prefix=r.teacher_prefix_reuse,
      )
    else:
      out = empty_teacher_batch(rows, r.teacher_seq_len, r.max_new_tokens, r.teacher_prefix_reuse)
    out["gap_row"] = np.zeros((rows,), np.float32)
    out["gap_row"][len(kept) : len(kept) + len(gaps)] = 1.0
    return out


class AsyncRolloutWorker:
  """Disaggregated mode: a thread plays batches `start..steps-1` in order, batch k with the
  weights of version max(k - max_staleness, start), while the trainer trains.

  `push(params, version)` after each optimizer step; `next()` returns the next `Rollout`
  (re-raising the thread's error, if any); `close()` stops the thread.
  """

  def __init__(
    self,
    sampler_: RolloutWorker,
    rng: np.random.Generator,
    *,
    start: int,
    steps: int,
    max_staleness: int,
  ):
    self._sampler, self._rng = sampler_, rng
    self._start, self._steps, self._staleness = start, steps, max_staleness
    self._weights: dict[int, Any] = {}
    self._cond = threading.Condition()
    self._out: queue.Queue = queue.Queue()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="rl-sampler", daemon=True)
    self._thread.start()

  def push(self, params: Any, version: int) -> None:
    with self._cond:
      self._weights[version] = params
      self._cond.notify_all()

  def _run(self):
    try:
      for k in range(self._start, self._steps):
        version = max(k - self._staleness, self._start)
        with self._cond:
          while version not in self._weights and not self._stop.is_set():
            self._cond.wait(timeout=0.1)
          if self._stop.is_set():
            return
          params = self._weights[version]
          for old in [v for v in self._weights if v < version]:  # no longer needed
            del self._weights[old]
        metrics = self._sampler.push(params, version)
        rollout = self._sampler.rollout(k, self._rng)
        rollout.row.update(metrics)
        self._out.put(rollout)
    except Exception as e:  # noqa: BLE001 -- handed to the trainer thread, which re-raises it
      self._out.put(e)

  def next(self) -> Rollout:
    item = self._out.get()
    if isinstance(item, Exception):
      raise item
    return item

  def close(self) -> None:
    self._stop.set()
    with self._cond:
      self._cond.notify_all()
    self._thread.join()
