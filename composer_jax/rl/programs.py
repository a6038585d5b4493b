"""The RL programs of a run, jitted on its mesh and cached like the supervised ones
(`train.programs.extend`: same layout, optimizer — sharded Muon or AdamW — and shardings, dual
mesh with EP / CP layers).

    update_program(config, model_cfg) -> UpdateProgram   the update (`rl.update.make_update`)
                                                          on a batch or on minibatch rows
    probe_program(config, model_cfg)                      the probes (`rl.sd_probes`)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import ml_collections
from jax.sharding import NamedSharding

from composer_jax.model.config import ModelConfig
from composer_jax.parallel import rules as rules_lib
from composer_jax.rl import mesh as rl_mesh
from composer_jax.rl import sd_probes, teacher
from composer_jax.rl.update import make_update
from composer_jax.train import programs


class UpdateProgram(NamedTuple):
  """The RL update on the run's mesh. `progs`: the run's `train.programs.Programs` (mesh,
  optimizer, `target` shardings, `init`); `update`: jitted `make_update` on a whole batch;
  `minibatch_update(params, opt_state, router, batch, rows [B / M], staleness [B / M],
  teacher_params, teacher_batch)`: the same on the batch's rows `rows` (`rl.mesh.select_rows`;
  the teacher batch restricted to them); `old_policy`: jitted; `per_token`: the `[rows, L]`
  batch sharding; `replicated`: for the router bias."""

  progs: programs.Programs
  update: Any
  minibatch_update: Any
  old_policy: Any
  per_token: rl_mesh.BatchLayout
  replicated: NamedSharding


def update_program(config, model_cfg: ModelConfig) -> UpdateProgram:
  """The (cached) RL update of `config` on its layout (`config.mesh`, `config.rules`)."""
  loss_cfg = ml_collections.FrozenConfigDict(config.loss)

  def build(progs: programs.Programs) -> UpdateProgram:
    update, old_policy = make_update(model_cfg, loss_cfg, progs.optimizer)
    per_token = rl_mesh.batch_layout(progs.mesh, config.rules)

    def minibatch_update(
      params, opt_state, router, batch, rows, staleness, teacher_params, teacher_batch
    ):
      mini = dict(rl_mesh.select_rows(batch, rows, per_token), staleness=staleness)
      if teacher_batch is not None:
        teacher_batch = teacher.restrict_to_rows(teacher_batch, rows)
      return update(params, opt_state, router, mini, teacher_params, teacher_batch)

    target = progs.target
    out = (
      jax.tree.map(lambda t: t.sharding, target.params),
      jax.tree.map(lambda t: t.sharding, target.opt_state),
      None,
    )
    on_mesh = lambda f, **kw: programs.on_mesh(progs.mesh, config.rules, f, **kw)
    return UpdateProgram(
      progs=progs,
      update=on_mesh(update, out_shardings=out),
      minibatch_update=on_mesh(minibatch_update, out_shardings=out),
      old_policy=on_mesh(old_policy),
      per_token=per_token,
      replicated=NamedSharding(
        progs.mesh.dense, rules_lib.logical_to_spec((), config.rules.dense, progs.mesh.dense)
      ),
    )

  return programs.extend("rl_update", config, model_cfg, config.loss.to_dict(), build)


def probe_program(config, model_cfg: ModelConfig):
  """The (cached, like the update) jitted probe of `config` on its layout:
  `rl.sd_probes.make_probe_fn`."""

  def build(progs: programs.Programs):
    return programs.on_mesh(
      progs.mesh, config.rules, sd_probes.make_probe_fn(model_cfg, config.loss)
    )

  return programs.extend("rl_probe", config, model_cfg, config.loss.to_dict(), build)
