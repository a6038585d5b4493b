"""HF tensor names <-> our parameter paths, with the layout change of each tensor.

HF `nn.Linear` weights are `[out, in]`; ours are input-first (`y = x @ W`) with per-head
axes split out (the parameter tree: `model.transformer.logical_axes`, names in `model/axes.py`):

| HF (per layer `model.layers.N.`)       | ours (leading [layer(, expert)] index)   |
|----------------------------------------|------------------------------------------|
| self_attn.q_a_proj   [Lq, D]           | attn.q_a.kernel  [D, Lq]                 |
| self_attn.q_b_proj   [H*(dn+dr), Lq]   | attn.q_b.kernel  [Lq, H, dn+dr]          |
| self_attn.q_proj     [H*(dn+dr), D]    | attn.q.kernel    [D, H, dn+dr]           |
| self_attn.kv_a_proj_with_mqa [Lkv+dr, D] | attn.kv_a.kernel [D, Lkv+dr]           |
| self_attn.kv_b_proj  [H*(dn+dv), Lkv]  | attn.kv_b.kernel [Lkv, H, dn+dv]         |
| self_attn.o_proj     [D, H*dv]         | attn.o.kernel    [H, dv, D]              |
| mlp.{gate,up,down}_proj (dense layer)  | mlp.{gate,up,down}.kernel (transposed)   |
| mlp.gate.weight [E, D]                 | moe.router.kernel [D, E]                 |
| mlp.gate.e_score_correction_bias [E]   | variables['router'] moe.bias [E]         |
| mlp.experts.J.{gate,up,down}_proj      | moe.experts.{gate,up,down} [.., J, in, out] |
| mlp.shared_experts.{gate,up,down}_proj | moe.shared.{gate,up,down}.kernel         |

Rope dims: our model rotates interleaved pairs, the layout of the released DeepSeek/Kimi
weights (HF `rope_interleave: true`, the default). A checkpoint saved with
`rope_interleave: false` stores each rope block half-split (`[x_0..x_{d/2-1} |
x_{d/2}..]`); its q_b / q / kv_a rope columns are re-interleaved on import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from composer_jax.model.config import ModelConfig

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Entry:
  """One HF tensor `f"{base}.{suffix}"` and the slice `variables[path][index]` it fills."""

  base: str
  suffix: str
  path: Path
  index: tuple[int, ...]
  hf_shape: tuple[int, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]

  @property
  def name(self) -> str:
    return f"{self.base}.{self.suffix}"


def _identity(x):
  return x


def _transpose(x):
  return x.T


def _interleave_perm(dim: int) -> np.ndarray:
  """Half-split rope layout -> interleaved pairs: new[2i] = old[i], new[2i+1] = old[i + d/2]."""
  return np.stack([np.arange(dim // 2), np.arange(dim // 2) + dim // 2], axis=1).reshape(-1)


def _rope_cols(width: int, dr: int, interleaved: bool) -> np.ndarray:
  """Column order (on the last axis of size `width`, rope dims last) that interleaves."""
  cols = np.arange(width)
  if not interleaved:
    cols[width - dr :] = width - dr + _interleave_perm(dr)
  return cols


def _heads_in(in_dim: int, heads: int, width: int, cols: np.ndarray):
  """[H*width, in] <-> [in, H, width], reordering the per-head columns by `cols`."""
  inverse = np.argsort(cols)
  return (
    lambda x: x.T.reshape(in_dim, heads, width)[..., cols],
    lambda y: y[..., inverse].reshape(in_dim, heads * width).T,
  )


def _o_proj(dim: int, heads: int, dv: int):
  """[D, H*dv] <-> [H, dv, D]."""
  return (
    lambda x: x.reshape(dim, heads, dv).transpose(1, 2, 0),
    lambda y: y.transpose(2, 0, 1).reshape(dim, heads * dv),
  )


def param_shapes(cfg: ModelConfig) -> dict[Path, tuple[int, ...]]:
  """Shape of every leaf of `variables` (paths start with 'params' or 'router')."""
  return _entries_and_shapes(cfg, True)[1]


def index_ranks(cfg: ModelConfig) -> dict[Path, int]:
  """Per leaf, how many leading axes index HF tensors (0, 1 = layer, 2 = layer+expert)."""
  return {e.path: len(e.index) for e in entries(cfg)}


def entries(cfg: ModelConfig, rope_interleave: bool = True) -> list[Entry]:
  """Every HF tensor of the text model (MTP layers excluded), in file order."""
  return _entries_and_shapes(cfg, rope_interleave)[0]


def _entries_and_shapes(cfg: ModelConfig, rope_interleave: bool):
  c = cfg
  if c.attention != "mla":
    raise ValueError(f"HF DeepSeek-V3 checkpoints use MLA, got attention={c.attention!r}")
  out: list[Entry] = []
  shapes: dict[Path, tuple[int, ...]] = {}

  def add(base, suffix, path, index, hf_shape, ours_shape, fns=(_transpose, _transpose)):
    out.append(Entry(base, suffix, path, index, tuple(hf_shape), *fns))
    shapes.setdefault(path, tuple(ours_shape))

  v, d = c.vocab_size, c.hidden_size
  add(
    "model.embed_tokens",
    "weight",
    ("params", "embed", "embedding"),
    (),
    (v, d),
    (v, d),
    (_identity, _identity),
  )
  groups = (
    ("dense_layers", 0, c.first_k_dense_replace),
    ("moe_layers", c.first_k_dense_replace, c.num_layers),
  )
  for group, start, stop in groups:
    for layer in range(start, stop):
      _layer(c, add, group, layer, layer - start, stop - start, rope_interleave)
  add(
    "model.norm",
    "weight",
    ("params", "final_norm", "scale"),
    (),
    (d,),
    (d,),
    (_identity, _identity),
  )
  if not c.tie_word_embeddings:
    add("lm_head", "weight", ("params", "lm_head", "kernel"), (), (v, d), (d, v))
  return out, shapes


def _layer(
  c: ModelConfig, add, group: str, layer: int, i: int, n: int, rope_interleave: bool
) -> None:
  """Entries of HF layer `layer`, slice `i` of our `n`-layer stack `group`."""
  d, h, dn, dr, dv = (
    c.hidden_size,
    c.num_heads,
    c.qk_nope_head_dim,
    c.qk_rope_head_dim,
    c.v_head_dim,
  )
  qk, lkv, e, fe = dn + dr, c.kv_lora_rank, c.n_routed_experts, c.moe_intermediate_size
  pre, p = f"model.layers.{layer}.", ("params", group)
  keep = (_identity, _identity)

  def lin(name, sub, hf_shape, shape, fns=(_transpose, _transpose), idx=(), lead=()):
    add(pre + name, "weight", p + sub, (i,) + idx, hf_shape, (n,) + lead + tuple(shape), fns)

  lin("input_layernorm", ("attn_norm", "scale"), (d,), (d,), keep)
  lin("post_attention_layernorm", ("mlp_norm", "scale"), (d,), (d,), keep)
  a = "self_attn."
  q_cols = _rope_cols(qk, dr, rope_interleave)
  if c.q_lora_rank is None:
    lin(a + "q_proj", ("attn", "q", "kernel"), (h * qk, d), (d, h, qk), _heads_in(d, h, qk, q_cols))
  else:
    lq = c.q_lora_rank
    lin(a + "q_a_proj", ("attn", "q_a", "kernel"), (lq, d), (d, lq))
    lin(a + "q_a_layernorm", ("attn", "q_norm", "scale"), (lq,), (lq,), keep)
    lin(
      a + "q_b_proj",
      ("attn", "q_b", "kernel"),
      (h * qk, lq),
      (lq, h, qk),
      _heads_in(lq, h, qk, q_cols),
    )
  kv_cols = _rope_cols(lkv + dr, dr, rope_interleave)
  kv_inv = np.argsort(kv_cols)
  lin(
    a + "kv_a_proj_with_mqa",
    ("attn", "kv_a", "kernel"),
    (lkv + dr, d),
    (d, lkv + dr),
    (lambda x: x.T[:, kv_cols], lambda y: y[:, kv_inv].T),
  )
  lin(a + "kv_a_layernorm", ("attn", "kv_norm", "scale"), (lkv,), (lkv,), keep)
  lin(
    a + "kv_b_proj",
    ("attn", "kv_b", "kernel"),
    (h * (dn + dv), lkv),
    (lkv, h, dn + dv),
    _heads_in(lkv, h, dn + dv, np.arange(dn + dv)),
  )
  lin(a + "o_proj", ("attn", "o", "kernel"), (d, h * dv), (h, dv, d), _o_proj(d, h, dv))
  if group == "dense_layers":
    f = c.intermediate_size
    for proj in ("gate", "up"):
      lin(f"mlp.{proj}_proj", ("mlp", proj, "kernel"), (f, d), (d, f))
    lin("mlp.down_proj", ("mlp", "down", "kernel"), (d, f), (f, d))
    return
  lin("mlp.gate", ("moe", "router", "kernel"), (e, d), (d, e))
  add(
    pre + "mlp.gate",
    "e_score_correction_bias",
    ("router", group, "moe", "bias"),
    (i,),
    (e,),
    (n, e),
    keep,
  )
  for j in range(e):
    for proj in ("gate", "up"):
      lin(
        f"mlp.experts.{j}.{proj}_proj",
        ("moe", "experts", proj),
        (fe, d),
        (d, fe),
        idx=(j,),
        lead=(e,),
      )
    lin(
      f"mlp.experts.{j}.down_proj",
      ("moe", "experts", "down"),
      (d, fe),
      (fe, d),
      idx=(j,),
      lead=(e,),
    )
  fs = c.n_shared_experts * fe
  if fs:
    for proj in ("gate", "up"):
      lin(f"mlp.shared_experts.{proj}_proj", ("moe", "shared", proj, "kernel"), (fs, d), (d, fs))
    lin("mlp.shared_experts.down_proj", ("moe", "shared", "down", "kernel"), (d, fs), (fs, d))
