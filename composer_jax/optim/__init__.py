"""Optimizers: Newton–Schulz, Muon, LR schedules and the Muon + AdamW training optimizer."""

from composer_jax.optim.builder import build_optimizer, param_labels, update_rms_by_group
from composer_jax.optim.config import default_config
from composer_jax.optim.muon import MuonState, scale_by_muon
from composer_jax.optim.newton_schulz import orthogonalize
from composer_jax.optim.schedules import make_schedule

__all__ = [
  "MuonState",
  "build_optimizer",
  "default_config",
  "make_schedule",
  "orthogonalize",
  "param_labels",
  "scale_by_muon",
  "update_rms_by_group",
]
