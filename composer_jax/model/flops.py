"""Model FLOPs per token, the numerator of MFU (PaLM, arXiv 2204.02311, App. B).

Counted from the config, not from a compiled program, so the figure does not reward an
implementation for doing redundant work (padding, recomputation, dense experts):

    forward  = 2 N + 2 Lyr H (d_qk + d_v) K
    training = 3 x forward at K = (T + 1) / 2

N: the active parameters a token multiplies (`transformer.param_counts`' active count
less the input embedding, which is a gather; a tied embedding is also the output head and
stays). K: keys a query attends; under the causal mask a row of T tokens attends
(T + 1) / 2 on average (PaLM's `12 Lyr H Q T` counts all T keys, twice this). MLA counts
its un-absorbed form: d_qk = qk_nope_head_dim + qk_rope_head_dim, d_v = v_head_dim.
Backward = 2 x forward (recomputation under remat is not counted).
"""

from __future__ import annotations

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig


def matmul_params(cfg: ModelConfig) -> int:
  """N above: active parameters less the (untied) input embedding."""
  _, active = transformer.param_counts(cfg)
  return active - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)


def forward_flops_per_token(cfg: ModelConfig, keys: float) -> float:
  """Forward FLOPs of one token attending `keys` keys in every layer."""
  if cfg.attention == "mla":
    d_qk, d_v = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim
  else:
    d_qk = d_v = cfg.head_dim
  attention = 2 * cfg.num_layers * cfg.num_heads * (d_qk + d_v) * keys
  return 2 * matmul_params(cfg) + attention


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Forward + backward FLOPs per token of causal rows of `seq_len` tokens."""
  return 3 * forward_flops_per_token(cfg, (seq_len + 1) / 2)
