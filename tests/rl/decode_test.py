"""rl.decode against the trainer's full forward, hand-computed nuclei and stop rules."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from composer_jax.model import transformer
from composer_jax.model.config import get_preset
from composer_jax.rl import decode, losses
from tests.model.random_variables import random_variables

_CFG = get_preset("tiny", num_layers=2)  # one dense + one MoE layer
B, P, N = 3, 6, 7
LENS = np.array([6, 2, 4])  # ragged, right-padded prompts
SAMPLING = dict(temperature=0.7, top_p=0.9)


@functools.cache
def _setup(attention):
  cfg = _CFG.replace(attention=attention)
  variables = random_variables(cfg)
  prompts = jax.random.randint(jax.random.key(1), (B, P), 0, cfg.vocab_size)
  return cfg, variables, prompts


_forward = jax.jit(transformer.forward, static_argnums=0)


def _generation_hidden(cfg, variables, prompts, tokens):
  """Full (uncached) forward on prompt + tokens per row -> hidden `[B, N, D]` predicting them."""
  seq = np.zeros((B, P + N), np.int32)
  for b, n in enumerate(LENS):
    seq[b, :n], seq[b, n : n + N] = prompts[b, :n], tokens[b]
  hidden, _ = _forward(cfg, variables, jnp.asarray(seq))
  return hidden[np.arange(B)[:, None], LENS[:, None] - 1 + np.arange(N)]


def _np_nucleus(logp, top_p):
  """float64 reference: renormalized log-probs of the smallest top set with mass >= top_p."""
  out = np.full_like(logp, -np.inf)
  for row, lp in zip(out, logp):
    order = np.argsort(-lp, kind="stable")
    probs = np.exp(lp[order])
    kept = order[: np.searchsorted(np.cumsum(probs), top_p) + 1]
    row[kept] = lp[kept] - np.log(np.exp(lp[kept]).sum())
  return out


_log_softmax = functools.partial(special.log_softmax, axis=-1)


@pytest.mark.parametrize("attention", ["mla", "gqa"])
def test_logprobs_match_trainer(attention):
  cfg, variables, prompts = _setup(attention)
  out = decode.sample(
    cfg, variables, prompts, LENS, jax.random.key(2), max_new_tokens=N, **SAMPLING
  )
  np.testing.assert_array_equal(out.lengths, [N] * B)
  hidden = _generation_hidden(cfg, variables, prompts, np.asarray(out.tokens))
  head = transformer.output_head(cfg, variables["params"])
  trainer, _ = losses.token_logprob_entropy(
    hidden.reshape(B * N, -1), head, out.tokens.reshape(-1), chunk=128
  )
  np.testing.assert_allclose(out.logprobs, trainer.reshape(B, N), atol=1e-5, rtol=0)
  # The sampling distribution: nucleus of softmax(z / T), in float64.
  logits = np.asarray(hidden @ head, np.float64).reshape(B * N, -1)
  q = _np_nucleus(_log_softmax(logits / SAMPLING["temperature"]), SAMPLING["top_p"])
  want = q[np.arange(B * N), np.asarray(out.tokens).reshape(-1)].reshape(B, N)
  assert np.isfinite(want).all(), "a sampled token lies outside the nucleus"
  np.testing.assert_allclose(out.sampling_logprobs, want, atol=1e-5, rtol=0)
  # Same key -> same output; another key -> other tokens.
  again = decode.sample(
    cfg, variables, prompts, LENS, jax.random.key(2), max_new_tokens=N, **SAMPLING
  )
  jax.tree.map(np.testing.assert_array_equal, again, out)
  other = decode.sample(
    cfg, variables, prompts, LENS, jax.random.key(3), max_new_tokens=N, **SAMPLING
  )
  assert not np.array_equal(other.tokens, out.tokens)


@pytest.mark.parametrize("attention", ["mla", "gqa"])
def test_greedy_equals_repeated_full_forward(attention):
  cfg, variables, prompts = _setup(attention)
  out = decode.sample(
    cfg, variables, prompts, LENS, jax.random.key(0), max_new_tokens=N, temperature=0.0
  )
  head = transformer.output_head(cfg, variables["params"])
  tokens = np.zeros((B, N), np.int32)
  for t in range(N):  # no cache: re-run the whole sequence for every new token
    logits = _generation_hidden(cfg, variables, prompts, tokens)[:, t] @ head
    tokens[:, t] = np.argmax(logits, -1)
  np.testing.assert_array_equal(out.tokens, tokens)
  want = _log_softmax(np.asarray(logits, np.float64))[np.arange(B), tokens[:, -1]]
  np.testing.assert_allclose(out.logprobs[:, -1], want, atol=1e-5, rtol=0)
  np.testing.assert_array_equal(out.sampling_logprobs, np.zeros((B, N)))


def _expected_lengths(tokens, stops):
  """First t (+1) at which a row's tokens[:t + 1] end with a stop sequence, else N."""
  lengths = []
  for row in tokens.tolist():
    ends = [
      t + 1
      for t in range(N)
      for s in stops
      if t + 1 >= len(s) and tuple(row[t + 1 - len(s) : t + 1]) == s
    ]
    lengths.append(min(ends, default=N))
  return np.array(lengths)


def test_stop_sequences_end_rows():
  cfg, variables, prompts = _setup("mla")
  free = decode.sample(
    cfg, variables, prompts, LENS, jax.random.key(2), max_new_tokens=N, **SAMPLING
  )
  toks = np.asarray(free.tokens)
  stops = ((int(toks[0, 2]),), (int(toks[2, 3]), int(toks[2, 4])))  # a token, a bigram
  out = decode.sample(
    cfg,
    variables,
    prompts,
    LENS,
    jax.random.key(2),
    max_new_tokens=N,
    stop_ids=(stops[0][0], stops[1]),
    pad_id=7,
    **SAMPLING,
  )
  lengths = _expected_lengths(toks, stops)
  assert lengths[0] <= 3 and lengths[2] <= 5
  np.testing.assert_array_equal(out.lengths, lengths)
  live = np.arange(N) < lengths[:, None]
  np.testing.assert_array_equal(out.tokens, np.where(live, toks, 7))
  np.testing.assert_allclose(out.logprobs, np.where(live, free.logprobs, 0), atol=1e-6)
  np.testing.assert_allclose(
    out.sampling_logprobs, np.where(live, free.sampling_logprobs, 0), atol=1e-6
  )


def test_top_p_by_hand():
  probs = np.array([[0.05, 0.5, 0.15, 0.3]])
  logp = jnp.log(jnp.asarray(probs, jnp.float32))
  cases = {
    0.7: [0, 0.5 / 0.8, 0, 0.3 / 0.8],  # 0.5 < 0.7 <= 0.5 + 0.3
    0.9: [0, 0.5 / 0.95, 0.15 / 0.95, 0.3 / 0.95],
    1.0: probs[0],
    1e-6: [0, 1, 0, 0],
  }  # only the top token
  for top_p, want in cases.items():
    got = np.exp(decode.top_p_logprobs(logp, top_p))
    np.testing.assert_allclose(got, [want], atol=1e-6, err_msg=f"top_p={top_p}")


@pytest.mark.parametrize(
  "change, match",
  [
    (dict(prompt_lens=np.array([7, 2, 4])), r"prompt_lens \[7, 2, 4\] must lie in \[1, 6\]"),
    (dict(prompt_lens=np.array([0, 2, 4])), "must lie in"),
    (dict(prompts=np.zeros((B, 30), np.int32)), "exceeds max_position_embeddings=32"),
    (dict(max_new_tokens=0), "max_new_tokens=0 must be an integer >= 1"),
    (dict(max_new_tokens=-3), "max_new_tokens=-3"),
    (dict(temperature=-0.5), "temperature=-0.5 must be"),
    (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
    (dict(top_p=1.5), "top_p=1.5"),
    (dict(stop_ids=((),)), "stop sequence"),
    (dict(stop_ids=(512,)), r"stop sequence \(512,\) must be"),
    (dict(prompts=np.zeros((B, P), np.float32)), "integer"),
  ],
)
def test_bad_inputs(change, match):
  cfg = _CFG.replace(max_position_embeddings=32)
  args = dict(prompts=np.zeros((B, P), np.int32), prompt_lens=LENS, max_new_tokens=N)
  args.update(change)
  variables = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  with pytest.raises(ValueError, match=match):
    decode.sample(
      cfg, variables, args.pop("prompts"), args.pop("prompt_lens"), jax.random.key(0), **args
    )


def _computations(hlo: str) -> tuple[str, dict[str, list[str]]]:
  """Optimized HLO text -> (the entry's name, {computation: its instruction lines})."""
  comps, entry, name = {}, None, None
  for line in hlo.splitlines():
    head = re.match(r"(ENTRY )?%(\S+) .*\{$", line)
    if head:
      name = head.group(2)
      comps[name] = []
      entry = name if head.group(1) else entry
    elif name and line.strip() not in ("", "}"):
      comps[name].append(line.strip())
  return entry, comps


@pytest.mark.parametrize("grouped_matmul", ["auto", "looped"])
def test_token_loop_reads_layer_and_expert_weights_in_place(grouped_matmul):
  """XLA:CPU does not hoist loop-invariant slices out of a while loop: neither a layer's
  weights out of their stack nor (grouped matmul `auto`) an expert's out of its layer's
  `[E, D, F]` may be sliced (copied) inside the token loop, once per token. An explicit
  grouped matmul is kept: `looped` slices each expert it runs."""
  # Two layers in each stack; no layer or expert weight shares a shape with another weight.
  cfg = get_preset(
    "tiny",
    num_layers=4,
    first_k_dense_replace=2,
    moe_intermediate_size=48,
    n_shared_experts=2,
    moe_grouped_matmul=grouped_matmul,
  )
  variables = transformer.init(cfg, jax.random.key(0))
  is_names = lambda x: isinstance(x, tuple)
  sliced = {1: set(), 2: set()}  # HLO shapes of a weight matrix's slice: one layer's, one expert's
  for names, x in zip(
    jax.tree.leaves(transformer.logical_axes(cfg), is_leaf=is_names), jax.tree.leaves(variables)
  ):
    lead = next((i for i, n in enumerate(names) if n not in ("layers", "experts")), len(names))
    for i in range(1, lead + 1):
      if x.ndim - i >= 2:  # matrices
        dtype, s = jnp.dtype(x.dtype).name.replace("float", "f"), x.shape[i:]
        sliced[i] |= {f"{dtype}[{','.join(map(str, t))}]" for t in (s, (1, *s))}
  assert "f32[8,64,48]" in sliced[1] and "f32[64,48]" in sliced[2]  # a layer's, an expert's gate
  hlo = (
    decode._sample.lower(
      cfg,
      variables,
      np.ones((B, P), np.int32),
      np.full((B,), P, np.int32),
      jax.random.key(0),
      max_new_tokens=N,
      temperature=jnp.float32(1),
      top_p=jnp.float32(1),
      stops=(),
      pad_id=0,
    )
    .compile()
    .as_text()
  )
  entry, comps = _computations(hlo)
  (loop,) = [line for line in comps[entry] if f"s32[{B},{N}]" in line and " while(" in line]
  todo, reached = [re.search(r"body=%(\S+?),", loop).group(1)], set()
  while todo:  # every computation the token loop's body runs (fusions, inner loops)
    name = todo.pop()
    if name not in reached:
      reached.add(name)
      todo += [c for line in comps[name] for c in re.findall(r"=%([\w.\-]+)", line)]
  copies = lambda shapes: [
    line
    for name in reached
    for line in comps[name]
    if (m := re.match(r"(?:ROOT )?%\S+ = (\w+\[[\d,]*\])\S* ([\w\-]+)\(", line))
    and m.group(1) in shapes
    and m.group(2) not in ("parameter", "get-tuple-element", "tuple", "bitcast")
  ]
  assert len(reached) > 1 and not copies(sliced[1]), copies(sliced[1])
  if grouped_matmul == "auto":
    assert not copies(sliced[2]), copies(sliced[2])
  else:
    assert copies(sliced[2])
