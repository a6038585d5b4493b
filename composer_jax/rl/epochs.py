"""K minibatch epochs over one RL batch: PPO's reuse of a batch (Schulman et al. 2017, §5).

    old = old_policy(pre-update weights, batch)          # once, before epoch 1
    for e in range(K):
      perm = permutation(fold_in(key, e), B)            # rows shuffled per epoch
      for j in range(M):
        state = update_fn(state, batch[perm[j*B/M:(j+1)*B/M]] | old)

Convention (PPO's): the ratio's denominator pi_old is the trainer's policy under the weights at
the start of the batch, computed once before the first epoch (`losses.make_old_policy_fn`) and
held fixed through all K * M updates, together with the GRPO advantages (computed on the whole
batch, so a minibatch that splits a group keeps them). The first minibatch update then has
ratio 1; later ones do not, and the clip acts. The truncated importance weight
min(pi_old / pi_sampler, C) (`losses.policy_loss`) corrects for the weights that sampled the
batch being stale and for sampler/trainer numerics.

Every minibatch has the static shape [B / M, ...], so the jitted `update_fn` compiles once.
Rows are whole trajectories (a row's tokens are never split across minibatches).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def validate(epochs, minibatches, rows: int | None = None) -> None:
  """Raises ValueError (one line) unless epochs >= 1, minibatches >= 1 and M divides `rows`."""
  for name, value in (("epochs", epochs), ("minibatches", minibatches)):
    if isinstance(value, bool) or int(value) != value or value < 1:
      raise ValueError(f"{name}={value!r} must be an integer >= 1")
  if rows is not None and rows % minibatches:
    divisors = [m for m in range(1, rows + 1) if rows % m == 0]
    raise ValueError(
      f"minibatches={minibatches} does not divide the batch of {rows} rows; valid: {divisors}"
    )


def minibatch_indices(key: jax.Array, rows: int, *, epochs: int, minibatches: int) -> np.ndarray:
  """`[epochs, minibatches, rows / minibatches]` row indices: epoch e is a permutation of the
  rows drawn with `fold_in(key, e)`, cut into M equal consecutive pieces."""
  validate(epochs, minibatches, rows)
  perms = [
    np.asarray(jax.random.permutation(jax.random.fold_in(key, e), rows)) for e in range(epochs)
  ]
  return np.stack(perms).reshape(epochs, minibatches, rows // minibatches)


def run_epochs(
  update_fn: Callable[[Any, dict], tuple[Any, dict]],
  state: Any,
  batch: dict[str, Any],
  *,
  epochs: int,
  minibatches: int,
  key: jax.Array,
) -> tuple[Any, dict[str, np.ndarray]]:
  """Applies `update_fn` to K epochs of M shuffled minibatches of `batch`.

  Args:
    update_fn: `(state, minibatch) -> (state, metrics)`, one optimizer step on a minibatch whose
      leaves are the batch's rows `[B / M, ...]` (jit it: the shape is static). The batch must
      already hold what the epochs keep fixed (`losses.make_old_policy_fn`: old_logprobs,
      advantage).
    state: whatever `update_fn` threads (params, optimizer state, ...).
    batch: dict of arrays with a leading row axis B. An optional `staleness [B]` (optimizer
      updates between the weights that sampled a row and the weights at the start of this call)
      is passed on plus the number of updates already applied here, so it measures each
      minibatch's actual lag.
    epochs: K >= 1 passes over the batch.
    minibatches: M >= 1 dividing B.
    key: PRNG key of the shuffles (epoch e uses `fold_in(key, e)`).

  Returns:
    (state after K * M updates, metrics: name -> `[K * M]` device array in update order, plus
    `epoch` and `minibatch` indices).
  """
  rows = {np.shape(v)[0] if np.ndim(v) else None for v in batch.values()}
  if len(rows) != 1 or None in rows:
    shapes = {k: np.shape(v) for k, v in batch.items()}
    raise ValueError(f"every batch entry needs the same leading row axis; got shapes {shapes}")
  (b,) = rows
  order = minibatch_indices(key, b, epochs=epochs, minibatches=minibatches)
  # Host arrays stay on the host (their minibatches are cut there, nothing waits on the device).
  batch = {k: v if isinstance(v, jax.Array) else np.asarray(v) for k, v in batch.items()}
  history = []
  for e in range(epochs):
    for j in range(minibatches):
      mini = {k: v[order[e, j]] for k, v in batch.items()}
      if "staleness" in mini:
        mini["staleness"] = mini["staleness"] + e * minibatches + j
      state, metrics = update_fn(state, mini)
      history.append(dict(metrics, epoch=e, minibatch=j))
  # Stacked on the device: nothing here waits for the updates to run.
  stacked = {k: jnp.stack([jnp.asarray(h[k]) for h in history]) for k in history[0]}
  return state, stacked
