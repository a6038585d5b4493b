"""The run config's `train` section (`default_config`), the optimizer settings a run trains
with (`optim_config`), and the one check of the config's numbers (`Range`, `check_ranges`,
`RANGES`). The whole schema is assembled in `experiments/configs/base.py`.

Every number a run reads has a valid range in a table, field -> `Range` (`RANGES` here for
`train`, `optim` and `data`; `rl.config.RANGES` for `rl` and `loss`); `check_ranges` raises one
line naming the first field out of range, its value and the range, when the config is read and
before anything compiles (`experiments.run`, `train.loop.validate`, `rl.run.validate`). NaN is
in no range; a bool is no number.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import ml_collections


@dataclasses.dataclass(frozen=True)
class Range:
  """Valid values of one config number: an integer or a finite float, within bounds.

  Attributes:
    lo, hi: bounds (None = unbounded); inclusive unless `lo_open` / `hi_open`.
    integer: only integers are valid (else any finite int or float).
    note: what special values mean, shown after the range (e.g. '0 = off').
  """

  lo: float | None = None
  hi: float | None = None
  lo_open: bool = False
  hi_open: bool = False
  integer: bool = False
  note: str = ""

  def contains(self, value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      return False
    if self.integer and not isinstance(value, int):
      return False
    if not math.isfinite(value):
      return False
    if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
      return False
    return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

  def describe(self, value=0) -> str:
    """'>= 1', 'finite and > 0', 'in [0, 1)', ...; 'an integer >= 1' when `value` is no int."""
    if self.lo is not None and self.hi is not None:
      bound = (
        f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
      )
    elif self.lo is not None:
      bound = f"{'>' if self.lo_open else '>='} {self.lo:g}"
    elif self.hi is not None:
      bound = f"{'<' if self.hi_open else '<='} {self.hi:g}"
    else:
      bound = ""
    if self.integer:
      is_int = isinstance(value, int) and not isinstance(value, bool)
      text = bound if is_int and bound else f"an integer {bound}".rstrip()
    elif bound.startswith("in "):
      text = bound
    else:
      text = f"finite and {bound}" if bound else "finite"
    return text + (f" ({self.note})" if self.note else "")


def check_ranges(config, table: Mapping[str, Range]) -> None:
  """Raises ValueError, one line, for the first `section.field` of `table` whose value in
  `config` is out of its range (fields the config lacks are skipped)."""
  for field, valid in table.items():
    section, name = field.split(".")
    if section not in config or name not in config[section]:
      continue
    value = config[section][name]
    if not valid.contains(value):
      shown = f"{value!r}" if isinstance(value, (str, bool)) or value is None else f"{value}"
      raise ValueError(f"{field}={shown} must be {valid.describe(value)}")


_INT0 = Range(0, integer=True)
_INT1 = Range(1, integer=True)
_NONNEG = Range(0)
_UNIT = Range(0, 1)
_DECAY = Range(0, 1, hi_open=True)

RANGES = {
  "train.steps": _INT1,
  "train.batch_size": _INT1,
  "train.seq_len": _INT1,
  "train.grad_accum": _INT1,
  "train.log_every": _INT1,
  "train.eval_every": Range(0, integer=True, note="0 = only at the end"),
  "train.eval_batches": _INT1,
  "train.ckpt_every": _INT1,
  "train.keep": _INT1,
  "train.seed": _INT0,
  "train.router_bias_rate": _NONNEG,
  "train.z_loss": _NONNEG,
  "train.loss_chunk": _INT1,
  "train.dry_run_devices": _INT1,
  "train.nan_at_step": Range(0, integer=True, note="0 = off"),
  "optim.lr": Range(0, note="a negative rate would ascend the loss"),
  "optim.adam_lr": Range(0, note="a negative rate would ascend the loss"),
  "optim.warmup_steps": _INT0,
  "optim.total_steps": Range(0, integer=True, note="0 = train.steps"),
  "optim.min_lr_ratio": _UNIT,
  "optim.wsd_decay_fraction": _UNIT,
  "optim.weight_decay": _NONNEG,
  "optim.b1": _DECAY,
  "optim.b2": _DECAY,
  "optim.eps": Range(0, lo_open=True),
  "optim.momentum": _DECAY,
  "optim.ns_steps": _INT1,
  "optim.ns_batch_elements": Range(-1, integer=True, note="0 = all at once, -1 = per backend"),
  "optim.grad_clip": Range(note="<= 0 = off"),
  "data.validation_fraction": Range(0, 1, hi_open=True),
  "data.seed": _INT0,
}


def default_config() -> ml_collections.ConfigDict:
  """Defaults of `config.train`: the supervised loop's (`train.loop`) and, for an RL run,
  the RL steps' (`rl.run`: steps, seed, logging, checkpoints, compile cache)."""
  return ml_collections.ConfigDict(
    {
      "steps": 300,  # optimizer steps of the run
      "batch_size": 16,  # global rows of seq_len tokens per optimizer step
      "seq_len": 128,
      "grad_accum": 1,  # micro-batches per step
      "log_every": 10,
      "eval_every": 50,  # 0 = only at the end
      "eval_batches": 4,
      "ckpt_every": 100,
      "keep": 3,  # checkpoints kept
      "seed": 0,
      "router_bias_rate": 1e-3,  # gamma of the aux-loss-free router-bias update
      "z_loss": 1e-4,
      "loss_chunk": 1024,  # tokens per vocab-projection chunk
      # '' = random init; else an import_hf output directory or a Hugging Face directory.
      "init_from": "",
      # Print the per-device memory plan for dry_run_devices devices and exit.
      "dry_run": False,
      "dry_run_devices": 1,
      # Testing aid: that step's loss mask is multiplied by NaN (the non-finite-loss stop).
      "nan_at_step": 0,
      # JAX's persistent compilation cache (`train.compile_cache`): '' = <workdir>/compile_cache,
      # 'none' = off; a directory owned by this user and writable by no one else.
      "compile_cache_dir": "",
    }
  )


def optim_config(config) -> ml_collections.ConfigDict:
  """`config.optim` with `total_steps` 0 (the default) replaced by `config.train.steps`: the
  LR schedule's length. A run stopped early and resumed under a larger `train.steps` keeps
  its schedule only if `optim.total_steps` is set explicitly."""
  optim = ml_collections.ConfigDict(config.optim.to_dict())
  if not optim.total_steps:
    optim.total_steps = config.train.steps
  return optim
