"""The jitted programs of a run and the shardings they use, cached per process.

One factory for every program: `programs(config, model_cfg)` (init, train and eval steps) and
`extend(name, ...)` (programs over the same layout: the RL update and probes,
`composer_jax.rl.programs`) jit their functions on the run's mesh with `on_mesh` and keep them
in one cache, keyed by what they depend on. So repeated runs in one process (LR sweeps that
share an LR, tests, notebooks, a figure's seeds, resuming) compile each program once; across
processes JAX's persistent compilation cache (`train.compile_cache`, enabled by every run)
skips the compile.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import optax

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig
from composer_jax.optim import build_optimizer, make_schedule, param_labels
from composer_jax.parallel import context_mesh
from composer_jax.parallel import rules as rules_lib
from composer_jax.parallel.mesh import DualMesh
from composer_jax.train import config as train_config
from composer_jax.train import placement
from composer_jax.train import step as step_lib
from composer_jax.train.state import TrainState, abstract_state, init_state

# Enough for every program of a text-feedback sweep (`experiments/tool_feedback/sweep.py`:
# the warm-up's and RL's programs, an update and a probe per arm: 10 for 4 arms), so its
# seeds after the first compile nothing; the oldest settings are dropped beyond that.
_CACHE_SIZE = 16
_cache: collections.OrderedDict = collections.OrderedDict()


class Programs(NamedTuple):
  """Everything of a run that depends only on model, optimizer, layout and loss settings.

  Attributes:
    mesh: the dual device mesh.
    optimizer: the optax transformation.
    target: TrainState of ShapeDtypeStructs carrying the state's shardings.
    train_batch_sharding, eval_batch_sharding: for [G, B, L] and [B, L] batches.
    init: `(key, variables or None) -> TrainState`, jitted onto `target`'s shardings.
    train_step: `(state, batch[G, B, L]) -> (state, metrics)`, state donated.
    eval_step: `(state, batch[B, L]) -> (ce_token_sum, num_tokens)`.
  """

  mesh: DualMesh
  optimizer: optax.GradientTransformation
  target: TrainState
  train_batch_sharding: Any
  eval_batch_sharding: Any
  init: Callable
  train_step: Callable
  eval_step: Callable


def on_mesh(mesh: DualMesh, rules, fn: Callable, **jit_kwargs) -> Callable:
  """`jax.jit(fn, **jit_kwargs)` run with `mesh` and the layout `rules` current: the model's
  shard_map layers (context-parallel attention, expert-parallel MoE) read them while tracing."""
  return jax.jit(context_mesh.with_mesh(mesh, rules, fn), **jit_kwargs)


def _build(config, model_cfg: ModelConfig) -> Programs:
  t = config.train
  dm = placement.build_mesh(config.mesh, model_cfg, t.seq_len)
  axes = transformer.logical_axes(model_cfg)["params"]
  # Param shardings first: on a multi-device mesh the optimizer runs the sharded Muon on them.
  param_shapes = transformer.shapes(model_cfg)["params"]
  optim = train_config.optim_config(config)
  optimizer = build_optimizer(
    optim, axes, rules_lib.param_shardings(axes, dm, config.rules, shapes=param_shapes)
  )
  abstract = abstract_state(model_cfg, optimizer, jax.ShapeDtypeStruct((2,), "uint32"))
  shardings = placement.state_shardings(abstract, optimizer, axes, dm, config.rules)
  target = jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
  )
  train_sharding, eval_sharding = placement.batch_shardings(dm, config.rules)
  train_step = step_lib.make_train_step(
    model_cfg,
    optimizer,
    make_schedule(optim, optim.lr),
    param_labels(optim, axes),
    loss_chunk=t.loss_chunk,
    z_loss=t.z_loss,
    router_bias_rate=t.router_bias_rate,
  )
  return Programs(
    mesh=dm,
    optimizer=optimizer,
    target=target,
    train_batch_sharding=train_sharding,
    eval_batch_sharding=eval_sharding,
    # init needs no mesh (single-device semantics), only its output shardings.
    init=jax.jit(lambda k, v: init_state(model_cfg, optimizer, k, v), out_shardings=shardings),
    train_step=on_mesh(
      dm, config.rules, train_step, donate_argnums=(0,), out_shardings=(shardings, None)
    ),
    eval_step=on_mesh(
      dm, config.rules, step_lib.make_eval_step(model_cfg, loss_chunk=t.loss_chunk)
    ),
  )


def _cached(key: list, build: Callable[[], Any]) -> Any:
  """`build()`, kept under `key` (JSON-able); the newest `_CACHE_SIZE` keys are kept."""
  key = json.dumps(key, sort_keys=True, default=str)
  if key not in _cache:
    _cache[key] = build()
    while len(_cache) > _CACHE_SIZE:
      _cache.popitem(last=False)
  _cache.move_to_end(key)
  return _cache[key]


def _layout_key(config, model_cfg: ModelConfig) -> list:
  return [
    model_cfg.to_dict(),
    train_config.optim_config(config).to_dict(),
    config.mesh.to_dict(),
    config.rules.to_dict(),
  ]


def programs(config, model_cfg: ModelConfig) -> Programs:
  """The (cached) programs of `config`."""
  t = config.train
  return _cached(
    ["lm", *_layout_key(config, model_cfg), t.loss_chunk, t.z_loss, t.router_bias_rate],
    lambda: _build(config, model_cfg),
  )


def extend(
  name: str, config, model_cfg: ModelConfig, settings: Any, build: Callable[[Programs], Any]
) -> Any:
  """`build(programs(config, model_cfg))` — a program over the run's mesh, optimizer and
  shardings (e.g. the RL update), jitted with `on_mesh` — cached with the others, keyed by
  `name`, the run's layout settings and `settings` (JSON-able: whatever else `build` depends
  on)."""
  return _cached(
    [name, settings, *_layout_key(config, model_cfg)], lambda: build(programs(config, model_cfg))
  )
