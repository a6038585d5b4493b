"""Model FLOPs per token (MFU's numerator) against a hand count of the `tiny` preset."""

import pytest

from composer_jax.model import config, flops


def test_tiny_matmul_params_and_train_flops_by_hand():
  # tiny: D=64, V=512 (untied), 3 layers (1 dense, 2 MoE), H=4, MLA q_lora=32, kv_lora=32,
  # nope=16, rope=8, v=16; dense FFN 128; experts of 32, top-2 of 8, 1 shared.
  attention = 64 * 32 + 32 + 32 * 4 * 24 + 64 * (32 + 8) + 32 + 32 * 4 * (16 + 16) + 4 * 16 * 64
  norms = 2 * 64
  dense_ffn = 3 * 64 * 128
  moe = 8 * 64 + 2 * 3 * 64 * 32 + 3 * 64 * 32  # router + 2 active experts + shared
  n = 3 * (attention + norms) + dense_ffn + 2 * moe + 64 + 64 * 512  # final norm, head
  cfg = config.get_preset("tiny")
  assert flops.matmul_params(cfg) == n == 143_488
  # causal rows of 128: each query attends 64.5 keys on average; QK^T (24) + AV (16) per head.
  attn = 2 * 3 * 4 * (24 + 16) * 64.5
  assert flops.train_flops_per_token(cfg, 128) == pytest.approx(3 * (2 * n + attn))


def test_tied_embedding_is_the_head_and_counts():
  cfg = config.get_preset("tiny")
  tied = cfg.replace(tie_word_embeddings=True)
  assert flops.matmul_params(tied) == flops.matmul_params(cfg)  # head kept, lookup dropped
