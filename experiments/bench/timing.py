"""Interleaved wall-clock timing: ratios that hold on a shared, noisy machine.

Each round calls every candidate once, in turn, so load from other processes hits all of
them alike; the figure per candidate is the median over rounds.
"""

import time
from collections.abc import Callable

import numpy as np


def interleaved(
  calls: dict[str, Callable[[], object]],
  rounds: int,
  block: Callable[[object], object] = lambda x: x,
) -> dict[str, float]:
  """{name: median seconds of `block(call())`} over `rounds` round-robin rounds.

  Every call runs once first, untimed (compilation, caches). `block` waits for the result
  (`jax.block_until_ready` for JAX; identity for eager PyTorch).
  """
  for call in calls.values():
    block(call())
  times = {name: [] for name in calls}
  for _ in range(rounds):
    for name, call in calls.items():
      t0 = time.perf_counter()
      block(call())
      times[name].append(time.perf_counter() - t0)
  return {name: float(np.median(t)) for name, t in times.items()}
