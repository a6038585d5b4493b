"""SwiGLU experts as a loop over experts and chunks of their rows (the CPU grouped matmul).

`y_r = (silu(h_r @ gate_e) * (h_r @ up_e)) @ down_e` for each row `r` of expert `e`'s group
in rows sorted by expert, the same function as `ragged_dot` of each matmul. The forward
and the row gradients of the backward (a written-out VJP) loop over each expert's chunks,
taking its weights out once per expert. The weight gradients `dW_e = X_e^T dZ_e` are summed
in that loop where an expert's `[D, F]` sums stay in cache (`CACHED_SUMS_BYTES`), else one
matmul per weight over a window of the expert's rows (`_weight_gradients`), so each sum is
written once per window of up to 8 chunks, not once per chunk; there the row gradients
`dZ_e W_e^T` are computed as `(W_e dZ_e^T)^T` (`_times_transposed`), which XLA:CPU runs at
the forward's rate. The per-tile `tiled` form instead copies an expert's weights for every
tile of rows and sums `[n_tiles, D, F]` per-tile gradients, which dominates when experts get
few rows (`RESULTS.md`, 2026-12-05).

Static shapes: an outer loop over the E experts (or, `unroll`, a Python loop: each expert's
weights at a static index, `moe._unrolled`), an inner loop over `ceil(g_e / chunk)`
chunks of `chunk` rows starting at the expert's first row; lanes past the group are
masked (they hold the next expert's rows, which that expert overwrites later). So the
chunked matmuls do at most `N + E * (chunk - 1)` rows' work; a window (`window_rows`) is one
chunk or less than twice its group.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np


def chunk_rows(num_rows: int, num_experts: int, max_rows: int, min_rows: int = 8) -> int:
  """Rows per chunk: a power of two near a quarter of the mean group, at least `min_rows`
  (8: at `small`'s 32-row mean group, 8-row chunks made the train step 3-5% faster than 16
  and 3% faster than 4; RESULTS.md, 2026-12-07), at most `max_rows`.

  Small chunks waste less on each group's last chunk; large ones make fewer loop trips.
  """
  quarter = max(1, num_rows // (4 * num_experts))
  return min(max_rows, max(min_rows, 1 << (quarter.bit_length() - 1)))


def _for_each_chunk(group_sizes, chunk, expert_init, chunk_body, expert_end, carry, unroll):
  """Folds `carry` over experts, and a per-expert `state` over that expert's chunks.

  `expert_init(e) -> state`; `chunk_body(row, mask [chunk], state, carry) -> (state, carry)`
  for the chunk starting at sorted row `row` (`mask`: its lanes inside the group);
  `expert_end(e, state, carry) -> carry`. `unroll`: the experts in a Python loop, `e` a
  static int (else a `fori_loop` index).
  """
  starts = jnp.cumsum(group_sizes) - group_sizes
  lanes = jnp.arange(chunk)

  def per_expert(e, carry):
    start, size = starts[e], group_sizes[e]

    def per_chunk(c, state_carry):
      return chunk_body(start + c * chunk, lanes < size - c * chunk, *state_carry)

    n_chunks = (size + chunk - 1) // chunk
    state, carry = jax.lax.fori_loop(0, n_chunks, per_chunk, (expert_init(e), carry))
    return expert_end(e, state, carry)

  if not unroll:
    return jax.lax.fori_loop(0, group_sizes.shape[0], per_expert, carry)
  for e in range(group_sizes.shape[0]):
    carry = per_expert(e, carry)
  return carry


def _zeros(shape, dtype, like):
  """Zeros typed like `like` under `shard_map` (varying over its manual axes), so that loop
  carries keep one type when the body mixes them with `like`."""
  return jax.lax.full_like(like, 0, dtype, shape)


def _padded(a, chunk):
  """`a` with `chunk` zero rows appended, so a chunk starting at any row stays in range."""
  return jnp.concatenate([a, jnp.zeros((chunk, *a.shape[1:]), a.dtype)])


def _rows(a, row, chunk):
  return jax.lax.dynamic_slice_in_dim(a, row, chunk)


def _put(buf, value, row):
  return jax.lax.dynamic_update_slice_in_dim(buf, value.astype(buf.dtype), row, 0)


def _put_expert(buf, value, e):
  """`buf [E, ...]` with expert `e`'s slice set to `value`."""
  return jax.lax.dynamic_update_index_in_dim(buf, value.astype(buf.dtype), e, 0)


def _forward(h, group_sizes, gate, up, down, chunk, unroll):
  """(`y [N, D]`, pre-activations `a = h @ gate`, `b = h @ up` `[N + chunk, F]`)."""
  n, d = h.shape
  f = gate.shape[-1]
  hp = _padded(h, chunk)

  def body(row, mask, w, bufs):
    g, u, dn = w
    y_buf, a_buf, b_buf = bufs
    x = _rows(hp, row, chunk)
    a, b = x @ g, x @ u
    y = jnp.where(mask[:, None], (jax.nn.silu(a) * b) @ dn, 0)
    return w, (_put(y_buf, y, row), _put(a_buf, a, row), _put(b_buf, b, row))

  zeros = lambda width: _zeros((n + chunk, width), h.dtype, h)
  y, a, b = _for_each_chunk(
    group_sizes,
    chunk,
    lambda e: (gate[e], up[e], down[e]),
    body,
    lambda e, w, bufs: bufs,
    (zeros(d), zeros(f), zeros(f)),
    unroll,
  )
  return y[:n], a, b


# An expert's weight-gradient sums (three float32 `[D, F]`) up to this size are added to
# chunk by chunk: they stay in a core's cache (1 MiB of L2 on the machine measured), and
# windows would only add work (`tiny`'s 3 x 8 KiB: its step was slower with windows).
# Larger ones (`small`'s 3 x 2 MiB) are written once per window (RESULTS.md, 2026-12-06).
CACHED_SUMS_BYTES = 1 << 20


def window_rows(chunk: int, num_rows: int) -> tuple[int, ...]:
  """Row counts of the weight-gradient windows: `chunk` x 1, 2, 4, 8, none past `num_rows`
  rounded up to a chunk, so the smallest window that holds a group is one chunk or less
  than twice the group. (Steps of 1.5x were no faster at `small`: fewer rows, more branches
  to compile.)"""
  top = -(-num_rows // chunk)
  return tuple(dict.fromkeys(chunk * min(m, top) for m in (1, 2, 4, 8)))


def _nt(z, w):
  """`z @ w^T`."""
  return jax.lax.dot_general(z, w, (((1,), (1,)), ((), ())))


def _times_transposed(z, w):
  """`z @ w^T` for a chunk `z [chunk, K]` and an expert's weight `w [N, K]`, as `(w @ z^T)^T`.

  With few rows, XLA:CPU runs `z @ w^T` (contracting `w`'s minor axis) at about two thirds
  of the rate of `w @ z^T` (RESULTS.md, 2026-12-07). The barriers keep XLA from folding the
  two small transposes (`z^T`, the result's) back into the first form.
  """
  z_t = jax.lax.optimization_barrier(z.T)
  return jax.lax.optimization_barrier(w @ z_t).T


def _chunk_backward(h, a_all, b_all, group_sizes, weights, dy_all, chunk, sum_weights, unroll):
  """The gradients through each row, in the forward's loop over chunks (each chunk reads
  its expert's weights): `dh [N + chunk, D]`, then with `sum_weights` the weight gradients
  like `weights`, summed chunk by chunk in float32, else `da`, `db [N + chunk, F]` for
  `_weight_gradients`."""
  n, d = h.shape
  f = weights[0].shape[-1]
  hp = _padded(h, chunk) if sum_weights else None
  dyp = _padded(dy_all, chunk)
  f32 = functools.partial(jax.lax.dot_general, preferred_element_type=jnp.float32)
  rows_t = (((0,), (0,)), ((), ()))  # contract the chunk's rows: X^T dZ
  # Weights small enough for cached sums stay in cache: there `dZ W^T` is as fast as is,
  # and the transposes of `_times_transposed` only add work (`tiny`).
  by_w_t = _nt if sum_weights else _times_transposed

  def expert_init(e):
    sums = tuple(_zeros(w.shape[1:], jnp.float32, h) for w in weights) if sum_weights else ()
    return tuple(w[e] for w in weights), sums

  def body(row, mask, state, bufs):
    (g, u, dn), sums = state
    dy = jnp.where(mask[:, None], _rows(dyp, row, chunk), 0)  # lanes of other experts: 0
    a, b = _rows(a_all, row, chunk), _rows(b_all, row, chunk)
    sig = jax.nn.sigmoid(a)
    silu = a * sig
    ds = by_w_t(dy, dn)
    da = ds * b * (sig * (1 + a * (1 - sig)))
    db = ds * silu
    dx = by_w_t(da, g) + by_w_t(db, u)
    if not sum_weights:
      return state, tuple(_put(buf, v, row) for buf, v in zip(bufs, (dx, da, db)))
    x = _rows(hp, row, chunk)
    terms = ((x, da), (x, db), (silu * b, dy))
    sums = tuple(acc + f32(p, q, rows_t) for acc, (p, q) in zip(sums, terms))
    return ((g, u, dn), sums), (_put(bufs[0], dx, row), *bufs[1:])

  def expert_end(e, state, bufs):
    if not sum_weights:
      return bufs
    return bufs[0], *(_put_expert(buf, v, e) for buf, v in zip(bufs[1:], state[1]))

  by_row = lambda width: _zeros((n + chunk, width), h.dtype, h)
  if sum_weights:
    bufs = (by_row(d), *(_zeros(w.shape, w.dtype, h) for w in weights))
  else:
    bufs = (by_row(d), by_row(f), by_row(f))
  return _for_each_chunk(group_sizes, chunk, expert_init, body, expert_end, bufs, unroll)


def _weight_gradients(h, a_all, b_all, da_all, db_all, dy_all, group_sizes, weights, windows):
  """(`dgate`, `dup`, `ddown`) like `weights`: `dW_e = X_e^T dZ_e` summed in float32.

  Each expert's rows go in windows of at most `windows[-1]` rows; each window is one matmul
  per weight over the smallest `windows` size that holds its rows (`lax.switch`; lanes
  past the group masked). Matmuls over a chunk at a time would read and write each
  expert's `[D, F]` float32 sum once per chunk, which costs more than the multiply itself
  when experts get few rows (`RESULTS.md`, 2026-12-06).
  """
  n = h.shape[0]
  top = windows[-1]
  h, a_all, b_all, da_all, db_all, dy_all = (
    _padded(x[:n], top) for x in (h, a_all, b_all, da_all, db_all, dy_all)
  )
  sizes = jnp.asarray(windows)
  starts = jnp.cumsum(group_sizes) - group_sizes
  x_t = functools.partial(
    jax.lax.dot_general,
    dimension_numbers=(((0,), (0,)), ((), ())),  # contract the rows: X^T dZ
    preferred_element_type=jnp.float32,
  )

  def window(k):
    def grads(row, size):
      mask = (jnp.arange(k) < size)[:, None]
      x, dy = _rows(h, row, k), _rows(dy_all, row, k)
      a, b = _rows(a_all, row, k), _rows(b_all, row, k)
      masked = lambda v: jnp.where(mask, v, 0)
      return (
        x_t(x, masked(_rows(da_all, row, k))),
        x_t(x, masked(_rows(db_all, row, k))),
        x_t(masked(jax.nn.silu(a) * b), dy),
      )

    return grads

  branches = [window(k) for k in windows]

  def grads_at(row, size):
    return jax.lax.switch(jnp.searchsorted(sizes, size), branches, row, size)

  def per_expert(e, out):
    start, size = starts[e], group_sizes[e]
    later = lambda w, acc: tuple(
      s + g for s, g in zip(acc, grads_at(start + w * top, jnp.minimum(top, size - w * top)))
    )
    first = grads_at(start, jnp.minimum(top, size))
    total = jax.lax.fori_loop(1, (size + top - 1) // top, later, first)
    return tuple(_put_expert(buf, v, e) for buf, v in zip(out, total))

  out = tuple(_zeros(w.shape, w.dtype, h) for w in weights)
  return jax.lax.fori_loop(0, group_sizes.shape[0], per_expert, out)


def _backward(h, a_all, b_all, group_sizes, gate, up, down, dy_all, chunk, unroll):
  """(`dh [N, D]`, `dgate`, `dup`, `ddown`): row gradients per chunk; weight gradients
  summed per chunk where an expert's three float32 sums fit `CACHED_SUMS_BYTES`, else per
  expert window."""
  n, d = h.shape
  weights = (gate, up, down)
  if 3 * d * gate.shape[-1] * 4 <= CACHED_SUMS_BYTES:
    dh, *dw = _chunk_backward(h, a_all, b_all, group_sizes, weights, dy_all, chunk, True, unroll)
  else:
    dh, da, db = _chunk_backward(
      h, a_all, b_all, group_sizes, weights, dy_all, chunk, False, unroll
    )
    dw = _weight_gradients(
      h, a_all, b_all, da, db, dy_all, group_sizes, weights, window_rows(chunk, n)
    )
  return dh[:n], *dw


def _varying_axes(a) -> frozenset:
  """The manual mesh axes `a` varies over inside `shard_map` (none outside)."""
  t = jax.typeof(a)
  return t.manual_axis_type.varying if hasattr(t, "manual_axis_type") else t.vma


def looped_swiglu(h, group_sizes, gate, up, down, chunk, unroll=False):
  """Experts on rows sorted by expert: `h [N, D]`, `group_sizes [E]` -> `[N, D]`.

  `gate`/`up [E, D, F]`, `down [E, F, D]`; rows past `group_sizes.sum()` give 0;
  `chunk`: rows per matmul (static); `unroll` (static): the experts unrolled, each read
  at a static index (see `moe._unrolled`). Under `shard_map` every input is first cast to vary
  over all the axes any of them varies over (e.g. weights sharded over experts, rows also
  over replicas), as autodiff of `ragged_dot` does: the weight gradients are then summed
  over the axes the weights do not vary over (the transpose of the cast).
  """
  args = (h, group_sizes, gate, up, down)
  axes = frozenset().union(*map(_varying_axes, args))
  cast = lambda a: (
    jax.lax.pcast(a, tuple(sorted(axes - _varying_axes(a))), to="varying")
    if axes - _varying_axes(a)
    else a
  )
  return _looped_swiglu(*map(cast, args), chunk, unroll)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _looped_swiglu(h, group_sizes, gate, up, down, chunk, unroll):
  return _forward(h, group_sizes, gate, up, down, chunk, unroll)[0]


def _looped_fwd(h, group_sizes, gate, up, down, chunk, unroll):
  y, a, b = _forward(h, group_sizes, gate, up, down, chunk, unroll)
  return y, (h, a, b, group_sizes, gate, up, down)


def _looped_bwd(chunk, unroll, res, dy):
  h, a, b, group_sizes, gate, up, down = res
  dh, dgate, dup, ddown = _backward(h, a, b, group_sizes, gate, up, down, dy, chunk, unroll)
  return dh, np.zeros(group_sizes.shape, jax.dtypes.float0), dgate, dup, ddown


_looped_swiglu.defvjp(_looped_fwd, _looped_bwd)
