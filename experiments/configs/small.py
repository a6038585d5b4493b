"""The `small` preset (~0.6B total / ~0.2B active parameters) on one GPU.

    python -m experiments.run --config=experiments/configs/small.py --workdir=workdir/small

bf16 activations, float32 params and optimizer state, `dots` remat; 64 rows x 2048 tokens
per step (131k tokens), 4 micro-batches of 16 rows.
"""

from composer_jax.model import config as model_config
from experiments.configs import base


def get_config(arg=None):
  arg = base.parse_arg(arg, layout="single")
  c = base.get_base_config()
  base.set_layout(c, arg.layout)
  c.model = model_config.preset_config("small")
  c.train.update(
    dict(
      steps=20_000,
      batch_size=64,
      seq_len=2048,
      grad_accum=4,
      log_every=50,
      eval_every=1000,
      eval_batches=16,
      ckpt_every=1000,
      loss_chunk=4096,
    )
  )
  c.optim.update(dict(lr=3e-3, adam_lr=3e-3, warmup_steps=500, weight_decay=0.1, schedule="wsd"))
  return c
