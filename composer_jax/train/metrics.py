"""Metric sinks: console line with ETA, `metrics.jsonl`, TensorBoard event files.

Each record is a flat dict of scalars with `step` (optimizer steps done) and `tokens`
(training tokens consumed so far). Train records carry `loss`, `grad_norm`, `lr`, `tokens_per_s`,
`moe/*` and `update_rms/*`; eval records carry `eval_loss`. The run's first train record also
carries `startup_s`: seconds from `train.loop.train`'s start until its first step's metrics
reached the host (tracing and compiling, or loading compiled programs from the cache).

`metrics.jsonl` holds every step once, whatever killed the run: each record is one `write`
of one line (a kill leaves at most a torn last line), and a resumed run first moves aside
what the checkpoint it resumed from does not cover: a torn line to `metrics.jsonl.torn`,
records of steps after the checkpoint (they are run again) to `metrics.jsonl.rerun`. None of
these files is written through a symbolic link (`host.files`).
"""

from __future__ import annotations

import json
import logging as py_logging
import math
import os
import time

from absl import logging

from composer_jax.host import files

_BAR = 20  # characters of the progress bar
# Keys shown on the console line, with their format; everything goes to the files.
_CONSOLE = (
  ("loss", "loss {:.4f}"),
  ("eval_loss", "eval_loss {:.4f}"),
  ("grad_norm", "gnorm {:.3f}"),
  ("lr", "lr {:.2e}"),
  ("moe/load_max_over_mean", "load {:.2f}"),
  ("tokens_per_s", "{:,.0f} tok/s"),
  ("reward", "reward {:.3f}"),
  ("unavailable_rate", "unavailable {:.3f}"),
)


class _DropLibraryInfo(py_logging.Filter):
  """Drops INFO records of orbax (dozens of lines per save) from the console."""

  def filter(self, record):
    return record.levelno > py_logging.INFO or "orbax" not in record.pathname


def quiet_library_logs() -> None:
  """Keeps the console to the training log: library INFO chatter is dropped."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _DropLibraryInfo) for f in handler.filters):
    handler.addFilter(_DropLibraryInfo())


def format_duration(seconds: float) -> str:
  """`83` -> `1m23s`; `4000` -> `1h06m40s`."""
  if not math.isfinite(seconds):
    return "?"
  s = int(round(seconds))
  h, m, s = s // 3600, s // 60 % 60, s % 60
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def read_metrics(workdir: str) -> list[dict]:
  """Records of `<workdir>/metrics.jsonl`, one per step, in step order (for a run that is
  still writing, an unterminated last line is skipped)."""
  path = os.path.join(workdir, "metrics.jsonl")
  by_step = {}
  with open(path) as f:
    for n, line in enumerate(f, start=1):
      if not line.endswith("\n"):
        break
      try:
        record = json.loads(line)
      except ValueError as e:
        raise ValueError(f"{path}:{n}: not a JSON record ({e}): {line[:80]!r}") from None
      by_step[record["step"]] = record
  return [by_step[s] for s in sorted(by_step)]


def _move_aside(path: str, start_step: int) -> None:
  """Keeps in `path` the complete records of steps <= `start_step`; appends a torn or
  unparsable line to `path.torn` and later steps' records to `path.rerun`."""
  lines = files.read_bytes(path).splitlines(keepends=True)
  keep, torn, rerun = [], [], []
  for line in lines:
    try:
      record = json.loads(line) if line.endswith(b"\n") else None
    except ValueError:
      record = None
    if not isinstance(record, dict) or not isinstance(record.get("step"), int):
      torn.append(line if line.endswith(b"\n") else line + b"\n")
    else:
      (keep if record["step"] <= start_step else rerun).append(line)
  for suffix, moved, what in (
    (".torn", torn, "torn or unreadable lines"),
    (".rerun", rerun, f"records after step {start_step}"),
  ):
    if moved:
      with files.open_append(path + suffix) as f:  # Before `path` shrinks: nothing is lost.
        f.write(b"".join(moved))
      logging.warning("Moved %d %s of %s to %s", len(moved), what, path, path + suffix)
  if torn or rerun:
    tmp = path + ".tmp"
    files.write_bytes(tmp, b"".join(keep))
    os.replace(tmp, path)


class MetricsWriter:
  """Writes records to the console, `<workdir>/metrics.jsonl` and `<workdir>/tensorboard/`.

  Files are appended to, so a resumed run continues the same curves; `start_step` is the
  step resumed from (0 for a fresh run): `metrics.jsonl` is first cut back to it.
  """

  def __init__(self, workdir: str, total_steps: int, start_step: int):
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "metrics.jsonl")
    if os.path.lexists(path):
      _move_aside(path, start_step)
    self._jsonl = files.open_append(path)  # One os.write per record: no torn lines.
    self._tb_dir = os.path.join(workdir, "tensorboard")
    self._tb = None  # Made at the first record: tensorboardX imports torch (~3 s), which
    # would otherwise delay the first step.
    self._total = total_steps
    self._start_step = start_step
    self._start_time = time.time()
    self._anchor = None  # (step, time) of the first record

  def write(self, record: dict, console: bool = True) -> None:
    """`record`: {'step': int, 'tokens': int, name: float, ...}; every record goes to the
    files, and to the console unless `console` is False."""
    self._jsonl.write((json.dumps(record) + "\n").encode())
    if self._tb is None:
      from tensorboardX import SummaryWriter

      self._tb = SummaryWriter(self._tb_dir)
    for k, v in record.items():
      if k != "step":
        self._tb.add_scalar(k, v, record["step"])
    self._tb.flush()
    if console:
      logging.info(self._console_line(record))

  def _console_line(self, record: dict) -> str:
    step, now = record["step"], time.time()
    if self._anchor is None:  # Until a second record, the rate includes compilation.
      self._anchor = (step, now)
      done, elapsed = step - self._start_step, now - self._start_time
    else:
      done, elapsed = step - self._anchor[0], now - self._anchor[1]
    eta = elapsed / done * (self._total - step) if done > 0 else float("nan")
    filled = int(_BAR * min(step / self._total, 1.0))
    parts = [f"step {step}/{self._total} [{'#' * filled}{'.' * (_BAR - filled)}]"]
    parts += [fmt.format(record[k]) for k, fmt in _CONSOLE if k in record]
    parts.append(f"eta {format_duration(eta)}")
    return " | ".join(parts)

  def close(self) -> None:
    self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
