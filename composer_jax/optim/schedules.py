"""Learning-rate schedules built from optax schedule pieces.

Both schedules warm up linearly from 0 at step 0 to `peak` at `warmup_steps`
(optax convention: the update of step 0 has LR 0) and end at
`floor = min_lr_ratio * peak`, where they stay after `total_steps`.

* 'cosine': lr(t) = floor + (peak - floor) · ½(1 + cos(π (t - w) / (T - w)))
  for w <= t <= T (Loshchilov & Hutter, SGDR, arXiv:1608.03983).
* 'wsd' (warmup-stable-decay; Hu et al., MiniCPM, arXiv:2404.06395): constant
  `peak` until T - d, then linear decay to `floor` over the last
  d = round(wsd_decay_fraction · T) steps (d = 0: no decay).
"""

import optax

SCHEDULES = ("cosine", "wsd")


def make_schedule(optim_cfg, peak: float) -> optax.Schedule:
  """Schedule for one optimizer group with peak LR `peak`.

  Args:
    optim_cfg: ConfigDict with schedule ('cosine'|'wsd'), warmup_steps,
      total_steps, min_lr_ratio and (for 'wsd') wsd_decay_fraction.
    peak: peak learning rate (optim_cfg.lr for Muon, optim_cfg.adam_lr for AdamW).

  Returns:
    step (int array) -> learning rate.
  """
  kind, warmup, total = optim_cfg.schedule, optim_cfg.warmup_steps, optim_cfg.total_steps
  if kind not in SCHEDULES:
    raise ValueError(f"Unknown LR schedule {kind!r}; valid: {SCHEDULES}")
  if not 0 <= warmup < total:
    raise ValueError(
      f"Need 0 <= warmup_steps < total_steps, got warmup_steps={warmup}, total_steps={total}"
    )
  ratio = optim_cfg.min_lr_ratio
  if not 0.0 <= ratio <= 1.0:
    raise ValueError(f"min_lr_ratio must be in [0, 1], got {ratio}")
  floor = ratio * peak
  # (schedule, first step); zero-length pieces are left out (optax warns about them).
  pieces = [(optax.linear_schedule(0.0, peak, warmup), 0)] if warmup else []
  if kind == "cosine":
    pieces.append((optax.cosine_decay_schedule(peak, total - warmup, alpha=ratio), warmup))
  else:
    fraction = optim_cfg.wsd_decay_fraction
    decay_steps = round(fraction * total)
    if not 0.0 <= fraction <= 1.0 or warmup + decay_steps > total:
      raise ValueError(
        f"wsd_decay_fraction={fraction} must be in [0, 1] with warmup_steps="
        f"{warmup} + decay steps {decay_steps} <= total_steps={total}"
      )
    pieces.append((optax.constant_schedule(peak), warmup))
    if decay_steps:
      pieces.append((optax.linear_schedule(peak, floor, decay_steps), total - decay_steps))
  schedules, starts = zip(*pieces, strict=True)
  return optax.join_schedules(list(schedules), list(starts[1:]))
