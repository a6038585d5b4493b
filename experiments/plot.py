"""Plots the metrics of one or more run directories to one PNG.

    python -m experiments.plot WORKDIR [WORKDIR ...] --out FILE.png [--x=tokens] [--smooth=0.9]

Reads each workdir's `metrics.jsonl` (`train.metrics.read_metrics`) and draws one panel per
metric that any of them logged, in `PANELS` order: training loss, validation loss, learning
rate, gradient norm, and for RL runs reward, every `*_rate` (flag rates such as
`unavailable_rate`, `verbose_rate`) and `flagged_turns`. Each workdir is one line in every
panel (labelled with its path), so several workdirs compare on one figure. `--x` is the
horizontal axis: optimizer `step` (default) or training `tokens` (supervised runs, for runs with
different batch sizes). `--smooth` draws the exponential moving average of each curve (the raw
points faint). A workdir without `metrics.jsonl`, or without `--x`'s key, is one error line.
"""

import math
import os
import sys

import matplotlib
from absl import app, flags

from composer_jax.train.metrics import read_metrics

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib import ticker  # noqa: E402

# (record key, panel title, log y axis), in the order drawn; then any other `*_rate` key.
PANELS = (
  ("loss", "training loss", False),
  ("eval_loss", "validation loss", False),
  ("lr", "learning rate", False),
  ("grad_norm", "gradient norm", True),
  ("reward", "reward", False),
  ("flagged_turns", "flagged turns", False),
)

_OUT = flags.DEFINE_string("out", None, "The PNG to write.", required=True)
_X = flags.DEFINE_enum("x", "step", ["step", "tokens"], "Horizontal axis.")
_SMOOTH = flags.DEFINE_float(
  "smooth",
  0.0,
  "EMA factor in [0, 1) of the drawn curves (0: raw).",
  lower_bound=0.0,
  upper_bound=0.999,
)


def panels(runs: dict[str, list[dict]]) -> list[tuple[str, str, bool]]:
  """The `PANELS` entries (then the `*_rate` keys, sorted) that some run's records hold."""
  keys = {k for records in runs.values() for r in records for k in r}
  rates = sorted(k for k in keys if k.endswith("_rate") and k not in {p[0] for p in PANELS})
  return [p for p in PANELS if p[0] in keys] + [(k, k.replace("_", " "), False) for k in rates]


def _ema(values: list[float], factor: float) -> list[float]:
  out, avg = [], None
  for v in values:
    avg = v if avg is None or not math.isfinite(avg) else factor * avg + (1 - factor) * v
    out.append(avg)
  return out


def plot(runs: dict[str, list[dict]], out: str, x: str = "step", smooth: float = 0.0) -> list[str]:
  """Draws `runs` ({label: records}) to the PNG `out`; returns the panel titles drawn.

  Raises:
    ValueError: no run holds any plotted metric.
  """
  chosen = panels(runs)
  if not chosen:
    raise ValueError(
      f"none of {sorted(runs)} logged any of {[p[0] for p in PANELS]} or a *_rate metric"
    )
  cols = min(3, math.ceil(math.sqrt(len(chosen))))
  rows = math.ceil(len(chosen) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, (key, title, log) in zip(axes.flat, chosen):
    for i, (label, records) in enumerate(runs.items()):
      points = [(r[x], r[key]) for r in records if key in r]
      if not points:
        continue
      xs, ys = zip(*points)
      color = colors[i % len(colors)]
      if smooth:
        ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
        ys = _ema(list(ys), smooth)
      ax.plot(xs, ys, color=color, label=label, marker="." if len(xs) < 20 else None)
    ax.set_title(title)
    ax.set_xlabel(x)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    if log:
      ax.set_yscale("log")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(chosen) :]:
    ax.set_visible(False)
  axes.flat[0].legend(fontsize="small")
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return [p[1] for p in chosen]


def _read(workdir: str, x: str) -> list[dict]:
  if not os.path.isfile(os.path.join(workdir, "metrics.jsonl")):
    raise ValueError(
      f"{workdir} has no metrics.jsonl: pass a run directory (a --workdir of "
      "experiments.run) that has logged a step"
    )
  records = read_metrics(workdir)
  if not any(x in r for r in records):
    raise ValueError(f"{workdir}/metrics.jsonl has no {x!r} (RL runs log steps only: --x=step)")
  return [r for r in records if x in r]


def main(argv):
  workdirs = argv[1:]
  if not workdirs:
    sys.exit(
      "error: name at least one WORKDIR: python -m experiments.plot WORKDIR ... --out FILE.png"
    )
  try:
    runs = {os.path.normpath(w): _read(w, _X.value) for w in workdirs}
    titles = plot(runs, _OUT.value, _X.value, _SMOOTH.value)
  except (ValueError, OSError) as e:
    sys.exit(f"error: {e}")
  print(f"Wrote {_OUT.value}: {', '.join(titles)} of {len(runs)} run(s)")


if __name__ == "__main__":
  app.run(main)
