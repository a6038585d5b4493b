"""Continued training of Kimi K2 (1026B total / 32.9B active parameters) on a 1024-chip pod.

Memory plan (no allocation, runs on a laptop):

    python -m experiments.run --config=experiments/configs/kimi_k2_continued.py \
        --config.train.dry_run=True

Real run, from weights imported once:

    python -m composer_jax.convert.import_hf --hf_dir=/ckpt/Kimi-K2.5 --out=/ckpt/kimi_k2_imported
    python -m experiments.run --config=experiments/configs/kimi_k2_continued.py \
        --config.train.init_from=/ckpt/kimi_k2_imported \
        --config.data.tokenizer=/ckpt/Kimi-K2.5/tiktoken.model \
        --config.data.paths=/data/code --workdir=/ckpt/kimi_k2_continued

Layout for 1024 devices (128 nodes x 8): the dense view is HSDP (16 replicas x FSDP 64), the
expert view is expert-parallel 128 (3 of the 384 experts per device) with each expert's
embed dim further sharded over the 8 expert replicas, so every expert weight is split
1024 ways. float32 master params and optimizer state, bf16 compute, full remat.
"""

from composer_jax.model import config as model_config
from experiments.configs import base


def get_config(arg=None):
  base.parse_arg(arg)  # no options: the layout is this config's own
  c = base.get_base_config()
  c.model = model_config.preset_config("kimi_k2")
  c.train.update(
    dict(
      steps=2000,
      batch_size=512,
      seq_len=8192,
      grad_accum=4,
      log_every=10,
      eval_every=200,
      eval_batches=8,
      ckpt_every=100,
      keep=2,
      loss_chunk=8192,
      dry_run_devices=1024,
    )
  )
  c.optim.update(
    dict(
      lr=2e-5, adam_lr=2e-5, warmup_steps=100, schedule="wsd", weight_decay=0.1, min_lr_ratio=0.1
    )
  )
  base.set_layout(c, "hsdp")
  c.layout = "kimi_k2_1024"
  c.mesh.update(dict(replica=16, fsdp=64, expert_replica=8, expert=128))
  c.rules.expert = [
    (name, "expert_replica") if name == "embed" else (name, axes) for name, axes in c.rules.expert
  ]
  return c
