"""The training optimizer: global-norm clipping, then Muon for matrices and AdamW for the rest.

    g   <- clip_by_global_norm(g, grad_clip)                  (skipped if grad_clip <= 0)
    Muon group  (axes.uses_muon): W <- W - η_t (U_t + λ W),   U_t from `muon.scale_by_muon`
    AdamW group (embeddings, output head, router, norm scales): optax.adamw with its
        own LR schedule; decoupled decay λ on every leaf except norm scales.

This is Moonlight's recipe (Liu et al., arXiv:2502.16982): with 'consistent_rms'
scaling the Muon group can use AdamW-like LR and weight decay.
`optim_cfg.name == 'adamw'` puts every parameter in the AdamW group (ablation).

Given the parameters' shardings on a multi-device mesh, the Muon group is the
sharded Muon (`sharded_muon.sharded_scale_by_muon`: whole-matrix Newton–Schulz via
grouped all-to-alls, no collective inside the iterations); on one device (or
without shardings) it is the per-leaf `muon.scale_by_muon`. Both compute the same
update.
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax

from composer_jax.model import axes as axes_lib
from composer_jax.optim import muon, schedules, sharded_muon

MUON, ADAMW = "muon", "adamw"
OPTIMIZERS = (MUON, ADAMW)


def param_labels(optim_cfg, logical_axes_tree: Any) -> Any:
  """Tree of 'muon' | 'adamw' like `logical_axes_tree` (the group of each parameter)."""
  if optim_cfg.name not in OPTIMIZERS:
    raise ValueError(f"Unknown optimizer name {optim_cfg.name!r}; valid: {OPTIMIZERS}")

  def label(names):
    return MUON if optim_cfg.name == MUON and axes_lib.uses_muon(names) else ADAMW

  return jax.tree.map(label, logical_axes_tree, is_leaf=muon.is_axes_leaf)


def _adamw(optim_cfg, logical_axes_tree: Any) -> optax.GradientTransformation:
  # Norm scales multiply activations; decaying them towards 0 only fights the model.
  decay_mask = jax.tree.map(
    lambda names: "norm" not in names, logical_axes_tree, is_leaf=muon.is_axes_leaf
  )
  return optax.adamw(
    schedules.make_schedule(optim_cfg, optim_cfg.adam_lr),
    b1=optim_cfg.b1,
    b2=optim_cfg.b2,
    eps=optim_cfg.eps,
    weight_decay=optim_cfg.weight_decay,
    mask=decay_mask,
  )


def _spans_devices(param_shardings: Any) -> bool:
  """True if any parameter sharding lives on more than one device."""
  return any(len(s.device_set) > 1 for s in jax.tree.leaves(param_shardings))


def build_optimizer(
  optim_cfg, logical_axes_tree: Any, param_shardings: Any = None
) -> optax.GradientTransformation:
  """Full optimizer for a parameter tree.

  Args:
    optim_cfg: ConfigDict with the fields of `optim.config.default_config()` (total_steps
      resolved: > 0; a run's is `train.config.optim_config`).
    logical_axes_tree: logical axes of the TRAINABLE tree, i.e.
      `transformer.logical_axes(cfg)['params']` (leaves: tuples of names).
    param_shardings: optional tree of NamedSharding like `logical_axes_tree`
      (`composer_jax.parallel.rules.param_shardings`); when it spans several
      devices, Muon runs sharded (module doc) and updates keep these shardings.

  Returns:
    optax GradientTransformation over trees shaped like `logical_axes_tree`.
  """
  labels = param_labels(optim_cfg, logical_axes_tree)
  adamw = _adamw(optim_cfg, logical_axes_tree)
  if optim_cfg.name == MUON:
    kwargs = dict(
      momentum=optim_cfg.momentum,
      nesterov=optim_cfg.nesterov,
      ns_coeffs=optim_cfg.ns_coeffs,
      ns_steps=optim_cfg.ns_steps,
      scale_mode=optim_cfg.muon_scale,
      ns_precision=optim_cfg.get("ns_precision", "float32"),
      ns_batch_elements=optim_cfg.get("ns_batch_elements", -1),
    )
    if param_shardings is not None and _spans_devices(param_shardings):
      direction = sharded_muon.sharded_scale_by_muon(logical_axes_tree, param_shardings, **kwargs)
    else:
      direction = muon.scale_by_muon(logical_axes_tree, **kwargs)
    muon_group = optax.chain(
      direction,
      optax.add_decayed_weights(optim_cfg.weight_decay),
      optax.scale_by_learning_rate(schedules.make_schedule(optim_cfg, optim_cfg.lr)),
    )
    tx = optax.partition({MUON: muon_group, ADAMW: adamw}, labels)
  else:
    tx = adamw
  if optim_cfg.grad_clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(optim_cfg.grad_clip), tx)
  return tx


def update_rms_by_group(updates: Any, labels: Any) -> dict[str, jax.Array]:
  """{group: sqrt(mean of squared update entries over the group's leaves)}.

  Args:
    updates: update tree (e.g. from `build_optimizer(...).update`).
    labels: same-structure tree of group names (`param_labels`).
  """
  sums: dict[str, Any] = {}
  counts: dict[str, int] = {}
  for u, group in zip(jax.tree.leaves(updates), jax.tree.leaves(labels), strict=True):
    sums[group] = sums.get(group, 0.0) + jnp.sum(jnp.square(u.astype(jnp.float32)))
    counts[group] = counts.get(group, 0) + u.size
  return {g: jnp.sqrt(sums[g] / counts[g]) for g in sums}
