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
