"""Confidence intervals over seeds, shared by the figures (a module without flags, so any
figure can import it: each figure's own module defines its command-line flags)."""

import numpy as np
from scipy import stats


def interval(values) -> tuple[float, float]:
  """(mean, half-width of the 95% Student-t interval of the mean); half-width 0 for one value,
  nan for none."""
  v = np.asarray([x for x in values if np.isfinite(x)], np.float64)
  if len(v) == 0:
    return float("nan"), float("nan")
  if len(v) == 1:
    return float(v[0]), 0.0
  return float(v.mean()), float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


def paired_bootstrap(
  values: dict[str, np.ndarray], base: str, n_boot: int = 4000, seed: int = 0
) -> tuple[dict, dict]:
  """95% percentile-bootstrap intervals of per-arm means over seeds and tasks, paired.

  Args:
    values: arm -> [seeds, tasks] scores (e.g. 0/1 passed), the same tasks and seeds in the
      same order for every arm.
    base: the arm the differences are taken against.
  Returns:
    ({arm: {"pass1", "ci95": [lo, hi], "seeds", "tasks"}}, the same for arm - base). Each
    bootstrap draw resamples seeds and tasks with replacement (two-level: a draw is the
    mean over the drawn seeds x drawn tasks) and uses the same draw for every arm, so a
    difference keeps its pairing by seed and task.
  """
  shapes = {a: v.shape for a, v in values.items()}
  if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
    raise ValueError(f"every arm needs the same [seeds, tasks] scores; got {shapes}")
  s, t = shapes[base]
  rng = np.random.default_rng(seed)
  si = rng.integers(s, size=(n_boot, s))
  ti = rng.integers(t, size=(n_boot, t))
  draws = {
    a: np.asarray(v, np.float64)[si[:, :, None], ti[:, None, :]].mean(axis=(1, 2))
    for a, v in values.items()
  }
  row = lambda mean, d: {
    "pass1": float(mean),
    "ci95": [float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))],
    "seeds": int(s),
    "tasks": int(t),
  }
  arms = {a: row(np.mean(v), draws[a]) for a, v in values.items()}
  diffs = {
    a: row(np.mean(v) - np.mean(values[base]), draws[a] - draws[base]) for a, v in values.items()
  }
  return arms, diffs
