"""Shared tiny run config for the trainer tests (compiles in seconds, runs in milliseconds)."""

import os
import sysconfig

import pytest

from composer_jax.train import loop
from experiments.configs import default

# A small corpus that does not change while tests run: the stdlib's asyncio sources.
DATA_DIR = os.path.join(sysconfig.get_paths()["stdlib"], "asyncio")
TOTAL_STEPS = 6


def tiny_config(steps: int = TOTAL_STEPS, **train):
  """Default config shrunk to seq 32 x batch 4. The LR schedule always spans TOTAL_STEPS
  steps, so runs stopped early and resumed see the same schedule (and share one compile)."""
  c = default.get_config()
  c.optim = c.optim.copy_and_resolve_references()
  c.optim.update(dict(total_steps=TOTAL_STEPS, warmup_steps=2))
  c.data.update(dict(paths=DATA_DIR, validation_fraction=0.2))
  c.train.update(
    {
      **dict(
        steps=steps,
        batch_size=4,
        seq_len=32,
        log_every=1,
        eval_every=3,
        eval_batches=1,
        ckpt_every=3,
      ),
      **train,
    }
  )
  return c


@pytest.fixture
def make_config():
  return tiny_config


@pytest.fixture(scope="session")
def full_run(tmp_path_factory):
  """An uninterrupted TOTAL_STEPS-step run: (workdir, records); checkpoints at 3 and 6.
  Tests that change the workdir work on a copy."""
  workdir = str(tmp_path_factory.mktemp("full"))
  return workdir, loop.train(tiny_config(), workdir)
