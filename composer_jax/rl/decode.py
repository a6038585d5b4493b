"""Decoding: jitted autoregressive sampling with a KV cache, the RL rollout policy.

One `jax.jit` per (config, shapes, stop sequences; temperature and top_p are traced): a prefill
writes the cache (`model.kv_cache`: the compressed latent for MLA, k/v per kv head for
GQA), then a `lax.while_loop` feeds one token per row per step until every row has stopped
or `max_new_tokens` are drawn.

Layout: prompts are RIGHT-padded, `prompts [B, P]` with row b's prompt in
`prompts[b, :prompt_lens[b]]` at positions `0..len_b - 1`; row b's t-th new token sits at
position `len_b + t`. Positions equal cache slots, so ragged rows share one cache; pad
slots are overwritten by a row's own new tokens before its queries can reach them.

Log-probs. Two are returned per sampled token y_t:
  * `logprobs`: `log softmax(z_t)[y_t]` of the unmodified model logits z_t (temperature 1,
    no top-p) — exactly what the trainer recomputes (`rl.losses`) for the same tokens, so
    `exp(trainer - sampler)` is the sampler/trainer numerical mismatch and the PPO ratio is
    meaningful. This goes into `Trajectory.sampler_logprobs`.
  * `sampling_logprobs`: `log q_t(y_t)` under the distribution actually sampled from,
    `q_t = top_p(softmax(z_t / temperature))` (nucleus renormalized); 0 for greedy
    (temperature 0). Use it when the behaviour policy itself is needed.
With temperature 1 and top_p 1 both are the same distribution. In float32 `logprobs` match
the trainer to ~1e-6. In bfloat16, MLA decodes in the absorbed form (`attention.MLA`), a
different rounding of the same function than the trainer's expanded form: measured on the tiny
preset, |sampler - trainer| is 0.017 nats on average (max 0.08), the same size as the bf16
trainer's own error against float32 (0.020 / 0.074); the loss's truncated importance weight is
meant for this mismatch. GQA matches the trainer to ~1e-7 in bfloat16 too.

Stopping: `stop_ids` is a tuple of stop sequences (an int is a one-token sequence); a row
ends right after its generated tokens end with one of them (the stop tokens are kept and
counted in `lengths`). Tokens after a row's end are `pad_id` with log-probs 0.

MoE layers decode with the dropless dispatch: capacity dispatch would make a token's
output depend on the other tokens of the step (`moe_dispatch='capacity'` is swapped for
'dropless'; 'dense' is kept).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.model import kv_cache, transformer
from composer_jax.model.config import ModelConfig


class SampleOutput(NamedTuple):
  """`tokens [B, N]` int32 (`pad_id` after the end), `logprobs [B, N]` float32 model
  log-probs at temperature 1 (0 after the end), `lengths [B]` int32 generated tokens
  (stop tokens included), `sampling_logprobs [B, N]` float32 under the sampling
  distribution (0 after the end; 0 everywhere for greedy)."""

  tokens: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  sampling_logprobs: jax.Array


def top_p_logprobs(logp: jax.Array, top_p: float) -> jax.Array:
  """Nucleus (Holtzman et al. 2019, arXiv 1904.09751) of `logp [B, V]` log-probs, renormalized.

  Keeps the most probable tokens until their mass reaches `top_p` (a token is kept iff the
  mass of the tokens ranked above it is `< top_p`; the top token always stays; ties broken
  by vocabulary index); the rest get `-inf`. Returns `[B, V]` log-probs.
  """
  order = jnp.argsort(-logp, axis=-1, stable=True)
  probs = jnp.exp(jnp.take_along_axis(logp, order, axis=-1))
  keep_sorted = jnp.cumsum(probs, axis=-1) - probs < top_p
  rows = jnp.arange(logp.shape[0])[:, None]
  keep = jnp.zeros(logp.shape, bool).at[rows, order].set(keep_sorted)
  return jax.nn.log_softmax(jnp.where(keep, logp, -jnp.inf), axis=-1)


def _draw(key, logits, temperature, top_p):
  """Samples `[B]` tokens from `logits [B, V]` -> (tokens, model log-probs, sampling log-probs).

  `temperature`, `top_p`: traced scalars; temperature 0 is greedy (sampling log-prob 0).
  """
  greedy = temperature == 0
  q = jax.nn.log_softmax(logits / jnp.where(greedy, 1.0, temperature), axis=-1)
  q = jax.lax.cond(top_p < 1, top_p_logprobs, lambda q, _: q, q, top_p)  # skip the sort at 1
  tokens = jnp.where(
    greedy, jnp.argmax(logits, axis=-1), jax.random.categorical(key, q, axis=-1)
  ).astype(jnp.int32)
  pick = lambda lp: jnp.take_along_axis(lp, tokens[:, None], axis=-1)[:, 0]
  return tokens, pick(jax.nn.log_softmax(logits, axis=-1)), jnp.where(greedy, 0.0, pick(q))


def _ends_with_stop(recent: jax.Array, stops: tuple[tuple[int, ...], ...]) -> jax.Array:
  """`[B]` bool: the last generated tokens `recent [B, M]` (-1 = none yet) end with a stop."""
  hit = jnp.zeros(recent.shape[:1], bool)
  for s in stops:
    hit |= jnp.all(recent[:, recent.shape[1] - len(s) :] == jnp.asarray(s, jnp.int32), axis=-1)
  return hit


def _split(x, names, axes):
  """`x` as nested tuples of its slices along its leading logical axes (`names`) that are in
  `axes`."""
  if names and names[0] in axes:
    return tuple(_split(s, names[1:], axes) for s in x)
  return x


def _sliced(cfg, variables, axes):
  """`variables` with each leaf split by `_split` along its leading logical `axes`."""
  return jax.tree.map(
    lambda names, x: _split(x, names, axes),
    transformer.logical_axes(cfg),
    variables,
    is_leaf=lambda n: isinstance(n, tuple),
  )


def _restacked(sliced):
  """`_sliced`'s output with each (nested) tuple of slices stacked back."""
  stack = lambda x: jnp.stack([stack(s) for s in x]) if isinstance(x, tuple) else x
  return jax.tree.map(stack, sliced, is_leaf=lambda x: isinstance(x, tuple))


class _State(NamedTuple):
  step: jax.Array  # scalar int32: index of the token being drawn
  cache: dict[str, Any]
  tokens: jax.Array  # [B, N]
  logprobs: jax.Array  # [B, N]
  sampling_logprobs: jax.Array  # [B, N]
  lengths: jax.Array  # [B], N until the row stops
  done: jax.Array  # [B] bool
  recent: jax.Array  # [B, M] last M generated tokens, M = longest stop sequence


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "stops", "pad_id"))
def _sample(
  cfg, variables, prompts, prompt_lens, key, *, max_new_tokens, temperature, top_p, stops, pad_id
):
  b, p = prompts.shape
  n = max_new_tokens
  head = transformer.output_head(cfg, variables["params"])

  def logits_at(hidden):  # [B, D] -> [B, V] float32, as the trainer's loss computes them
    return jnp.dot(hidden, head.astype(hidden.dtype), preferred_element_type=jnp.float32)

  def emit(state, logits):
    """Draws token `state.step` from `logits [B, V]` and records it."""
    t = state.step
    tok, lp, slp = _draw(jax.random.fold_in(key, t), logits, temperature, top_p)
    live = ~state.done
    recent = jnp.concatenate([state.recent[:, 1:], tok[:, None]], axis=1)
    stopped = live & _ends_with_stop(recent, stops)
    return state._replace(
      step=t + 1,
      tokens=state.tokens.at[:, t].set(jnp.where(live, tok, pad_id)),
      logprobs=state.logprobs.at[:, t].set(jnp.where(live, lp, 0.0)),
      sampling_logprobs=state.sampling_logprobs.at[:, t].set(jnp.where(live, slp, 0.0)),
      lengths=jnp.where(stopped, t + 1, state.lengths),
      done=state.done | stopped,
      recent=recent,
    )

  # Prefill: the whole padded prompt; the next-token logits of row b are at len_b - 1.
  cache = kv_cache.init(cfg, b, p + n - 1)
  hidden, cache = transformer.decode(
    cfg, variables, prompts, jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p)), cache
  )
  state = _State(
    step=jnp.zeros((), jnp.int32),
    cache=cache,
    tokens=jnp.full((b, n), pad_id, jnp.int32),
    logprobs=jnp.zeros((b, n), jnp.float32),
    sampling_logprobs=jnp.zeros((b, n), jnp.float32),
    lengths=jnp.full((b,), n, jnp.int32),
    done=jnp.zeros((b,), bool),
    recent=jnp.full((b, max([len(s) for s in stops], default=1)), -1, jnp.int32),
  )
  state = emit(state, logits_at(hidden[jnp.arange(b), prompt_lens - 1]))

  # XLA:CPU does not hoist loop-invariant slices out of a while loop: layer l's weights,
  # indexed out of their stack inside the loop, would be copied on every token, and so
  # would expert e's out of its layer's `[E, D, F]`. So on CPU the layers and, with the
  # `auto` grouped matmul, the experts are sliced once, here; inside, the stacks are rebuilt
  # from the slices and indexed at static indices (layers and experts unrolled:
  # `scan_layers=False`, the `unrolled` grouped matmul), which XLA folds back to the
  # slices. The price: the loop body's compile time grows with layers x experts (an
  # explicit grouped matmul, e.g. `looped` for many experts, is kept). GPU/TPU keep the
  # config's loops (compile time flat in depth; not measured there yet).
  if jax.default_backend() == "cpu":
    per_expert = cfg.moe_grouped_matmul == "auto"
    sliced = _sliced(cfg, variables, ("layers", "experts") if per_expert else ("layers",))
    grouped = "unrolled" if per_expert else cfg.moe_grouped_matmul
    step_cfg = cfg.replace(scan_layers=False, moe_grouped_matmul=grouped)
    step_variables = lambda: _restacked(sliced)
  else:
    step_variables, step_cfg = lambda: variables, cfg

  def body(state):
    # Feed token t-1 at position len_b + t - 1, then draw token t.
    t = state.step
    prev = state.tokens[:, t - 1]  # pad_id for stopped rows: their outputs are discarded
    hidden, cache = transformer.decode(
      step_cfg,
      step_variables(),
      prev[:, None],
      (prompt_lens + t - 1)[:, None],
      state.cache,
    )
    return emit(state._replace(cache=cache), logits_at(hidden[:, 0]))

  state = jax.lax.while_loop(lambda s: (s.step < n) & ~jnp.all(s.done), body, state)
  return SampleOutput(state.tokens, state.logprobs, state.lengths, state.sampling_logprobs)


def _stop_sequences(stop_ids, vocab_size: int) -> tuple[tuple[int, ...], ...]:
  """Normalizes `stop_ids` (ints and/or sequences of ints) to a tuple of int tuples."""
  stops = tuple((int(s),) if np.ndim(s) == 0 else tuple(int(i) for i in s) for s in stop_ids)
  for s in stops:
    if not s or not all(0 <= i < vocab_size for i in s):
      raise ValueError(f"stop sequence {s} must be non-empty token ids in [0, {vocab_size})")
  return stops


def sample(
  cfg: ModelConfig,
  variables: dict[str, Any],
  prompts: jax.Array,
  prompt_lens: jax.Array,
  key: jax.Array,
  *,
  max_new_tokens: int,
  temperature: float = 1.0,
  top_p: float = 1.0,
  stop_ids=(),
  pad_id: int = 0,
) -> SampleOutput:
  """Samples up to `max_new_tokens` tokens after each right-padded prompt.

  Args:
    cfg: the model config (static).
    variables: `{'params': ..., 'router': ...}` as from `transformer.init`.
    prompts: `[B, P]` int token ids, right-padded.
    prompt_lens: `[B]` int, `1 <= prompt_lens[b] <= P`.
    key: PRNG key; the same key and inputs give the same output.
    max_new_tokens: N >= 1; `P + N - 1 <= cfg.max_position_embeddings`.
    temperature: >= 0; 0 = greedy (argmax). Traced: new values do not recompile.
    top_p: nucleus mass in (0, 1]; 1 = off (no sort at run time). Traced.
    stop_ids: stop sequences: a tuple of token ids and/or tuples of token ids. Static.
    pad_id: token written after a row's end. Static.

  Returns:
    `SampleOutput(tokens [B, N], logprobs [B, N], lengths [B], sampling_logprobs [B, N])`;
    see the module docstring for the two log-probs.
  """
  prompts = jnp.asarray(prompts)
  prompt_lens = jnp.asarray(prompt_lens)
  if prompts.ndim != 2 or not jnp.issubdtype(prompts.dtype, jnp.integer):
    raise ValueError(
      f"prompts must be an integer [batch, prompt_len] array, got {prompts.dtype} {prompts.shape}"
    )
  b, p = prompts.shape
  if prompt_lens.shape != (b,) or not jnp.issubdtype(prompt_lens.dtype, jnp.integer):
    raise ValueError(
      f"prompt_lens must be an integer [{b}] array, got {prompt_lens.dtype} {prompt_lens.shape}"
    )
  if not isinstance(prompt_lens, jax.core.Tracer):
    # Each process checks the rows it holds (all rows, unless they span several processes).
    lens = (
      np.asarray(prompt_lens)
      if prompt_lens.is_fully_addressable
      else np.concatenate([np.ravel(s.data) for s in prompt_lens.addressable_shards])
    )
    if lens.min() < 1 or lens.max() > p:
      raise ValueError(
        f"prompt_lens {lens.tolist()} must lie in [1, {p}] (the padded prompt length)"
      )
  if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be an integer >= 1")
  if p + max_new_tokens - 1 > cfg.max_position_embeddings:
    raise ValueError(
      f"prompt length {p} + max_new_tokens {max_new_tokens} - 1 exceeds "
      f"max_position_embeddings={cfg.max_position_embeddings}"
    )
  if not temperature >= 0 or not np.isfinite(temperature):
    raise ValueError(f"temperature={temperature} must be finite and >= 0 (0 = greedy)")
  if not 0 < top_p <= 1:
    raise ValueError(f"top_p={top_p} must be in (0, 1] (1 = no nucleus truncation)")
  if cfg.moe_dispatch == "capacity":
    cfg = cfg.replace(moe_dispatch="dropless")
  return _sample(
    cfg,
    variables,
    prompts.astype(jnp.int32),
    prompt_lens.astype(jnp.int32),
    key,
    max_new_tokens=int(max_new_tokens),
    temperature=jnp.float32(temperature),
    top_p=jnp.float32(top_p),
    stops=_stop_sequences(stop_ids, cfg.vocab_size),
    pad_id=int(pad_id),
  )
