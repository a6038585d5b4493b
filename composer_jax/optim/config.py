"""The run config's `optim` section: every field `build_optimizer` and `make_schedule` read."""

from __future__ import annotations

import ml_collections


def default_config() -> ml_collections.ConfigDict:
  """Muon for matrices + AdamW for the rest (`optim.builder`), cosine schedule."""
  return ml_collections.ConfigDict(
    {
      "name": "muon",  # 'muon' | 'adamw' (every parameter in the AdamW group)
      "lr": 0.02,  # peak LR of the Muon group
      "adam_lr": 3e-3,  # peak LR of the AdamW group
      "schedule": "cosine",  # 'cosine' | 'wsd' (`optim.schedules`)
      "warmup_steps": 20,
      "total_steps": 0,  # the schedule's length; 0 = the run's train.steps
      "min_lr_ratio": 0.1,
      "wsd_decay_fraction": 0.2,
      "weight_decay": 0.0,
      "b1": 0.9,
      "b2": 0.95,
      "eps": 1e-8,  # AdamW
      "momentum": 0.95,
      "nesterov": True,  # Muon
      "ns_coeffs": "quintic",
      "ns_steps": 5,
      "ns_precision": "float32",  # Newton–Schulz
      # NS in chunks of at most this many matrix entries; 0 = all at once; -1 = per backend
      # (`optim.newton_schulz.resolve_batch_elements`)
      "ns_batch_elements": -1,
      "muon_scale": "consistent_rms",
      "grad_clip": 1.0,  # global-norm clip; <= 0 = off
    }
  )
