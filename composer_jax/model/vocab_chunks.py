"""Vocabulary-chunked passes over `hidden @ head` that never hold [tokens, vocab] logits.

The output head `[D, V]` is read in `[D, C]` column blocks by `dynamic_slice` inside the loop (no
re-laid-out copy of the head; when C does not divide V the head is zero-padded once and the padded
columns read a large negative logit that counts for nothing). A `lax.scan` over blocks feeds
`[N, C]` float32 logits of each block to an accumulator; the scan body is rematerialized
(`jax.checkpoint`) so the backward pass also holds one block at a time. `map_tokens` adds an outer
loop over token blocks so at most `[token_chunk, C]` logits are live.

Log-normalizers are computed online (running max m and sum s of exp(z - m), "online softmax",
Milakov & Gimelshein 2018); m is under stop_gradient, which leaves lse = m + log s and its gradient
(the softmax) exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

# Logit given to padded vocabulary columns: exp(NEG - m) == 0, and differences stay finite.
NEG = -1e30


class Logits(NamedTuple):
  """Sum of weighted (hidden [N, D], head [D, V]) products: logits = sum_i w_i h_i @ W_i."""

  hiddens: tuple[jax.Array, ...]
  heads: tuple[jax.Array, ...]
  weights: tuple[float, ...]


def single(hidden: jax.Array, head: jax.Array) -> Logits:
  return Logits((hidden,), (head,), (1.0,))


def _pad_vocab(head: jax.Array, chunk: int) -> jax.Array:
  """[D, V] -> [D, ceil(V / chunk) * chunk], zero columns appended (a no-op when C divides V)."""
  return jnp.pad(head, ((0, 0), (0, -head.shape[1] % chunk)))


def scan_vocab(body: Callable, carry, streams: Sequence[Logits], chunk_size: int):
  """Runs `carry = body(carry, logits_per_stream, cols, valid)` over vocabulary chunks.

  Args:
    body: `(carry, tuple of [N, C] float32 logits, cols [C] int32 vocab ids, valid [C] bool)`
      -> carry. Padded columns already hold NEG.
    carry: initial accumulator (pytree).
    streams: the logits to evaluate chunk by chunk (e.g. student, teacher); all with the same V.
    chunk_size: C.

  Returns:
    The final carry.
  """
  vocab = streams[0].heads[0].shape[1]
  chunk = min(chunk_size, vocab)
  padded = [tuple(_pad_vocab(w, chunk) for w in s.heads) for s in streams]
  num_chunks = padded[0][0].shape[1] // chunk

  @jax.checkpoint
  def step(carry, index):
    cols = index * chunk + jnp.arange(chunk, dtype=jnp.int32)
    valid = cols < vocab
    logits = []
    for stream, heads in zip(streams, padded):
      z = sum(
        w
        * jnp.einsum(
          "nd,dc->nc",
          h,
          jax.lax.dynamic_slice_in_dim(head, index * chunk, chunk, axis=1),
          preferred_element_type=jnp.float32,
        )
        for h, head, w in zip(stream.hiddens, heads, stream.weights)
      )
      # Only a padded head has columns to mask (a select over [N, C] costs a pass of its own).
      logits.append(z if vocab % chunk == 0 else jnp.where(valid, z, NEG))
    return body(carry, tuple(logits), cols, valid), None

  carry, _ = jax.lax.scan(step, carry, jnp.arange(num_chunks, dtype=jnp.int32))
  return carry


class OnlineLse(NamedTuple):
  """Running log-sum-exp state, plus the running sum of exp(z - m) * z (for the entropy)."""

  m: jax.Array  # [N] running max (stop-gradient)
  s: jax.Array  # [N] sum exp(z - m)
  sz: jax.Array  # [N] sum exp(z - m) * z

  @classmethod
  def init(cls, n: int) -> OnlineLse:
    return cls(jnp.full((n,), NEG, jnp.float32), jnp.zeros((n,)), jnp.zeros((n,)))

  def update(self, z: jax.Array) -> OnlineLse:
    m = jax.lax.stop_gradient(jnp.maximum(self.m, z.max(-1)))
    scale = jnp.exp(self.m - m)
    e = jnp.exp(z - m[:, None])
    return OnlineLse(m, self.s * scale + e.sum(-1), self.sz * scale + (e * z).sum(-1))

  def lse(self) -> jax.Array:
    return self.m + jnp.log(self.s)

  def entropy(self) -> jax.Array:
    """H = lse - E_p[z]."""
    return self.lse() - self.sz / self.s


def pick(z: jax.Array, cols: jax.Array, ids: jax.Array) -> jax.Array:
  """sum over the chunk of z[n, c] where cols[c] == ids[n]: the logit of `ids` if in this chunk."""
  return jnp.where(cols[None, :] == ids[:, None], z, 0.0).sum(-1)


def lse_and_target_logit(
  hidden: jax.Array, head: jax.Array, targets: jax.Array, chunk: int
) -> tuple[OnlineLse, jax.Array]:
  """Log-normalizer state [N] and target logit z[n, targets[n]] [N] of hidden [N, D] @ head
  [D, V], over vocabulary chunks of `chunk` columns: log p(targets) = z_y - lse.lse()."""

  def body(carry, logits, cols, valid):
    del valid
    lse, z_y = carry
    return lse.update(logits[0]), z_y + pick(logits[0], cols, targets)

  n = targets.shape[0]
  return scan_vocab(body, (OnlineLse.init(n), jnp.zeros(n)), (single(hidden, head),), chunk)


def map_tokens(fn: Callable, token_chunk: int, *arrays: jax.Array):
  """Applies per-token `fn(*arrays) -> pytree of [N, ...]` in blocks of `token_chunk` rows.

  `token_chunk <= 0` or >= N runs `fn` once. Rows padded to fill the last block are dropped.
  """
  n = arrays[0].shape[0]
  if token_chunk <= 0 or token_chunk >= n:
    return fn(*arrays)
  blocks = -(-n // token_chunk)
  pad = blocks * token_chunk - n
  tiled = [
    jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)).reshape(blocks, token_chunk, *a.shape[1:])
    for a in arrays
  ]
  out = jax.lax.map(lambda xs: fn(*xs), tuple(tiled))
  return jax.tree.map(lambda x: x.reshape(blocks * token_chunk, *x.shape[2:])[:n], out)
