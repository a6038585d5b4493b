"""Session fixtures: the synthetic mini project and tasks generated from it once (no network)."""

from pathlib import Path

import pytest

from composer_jax.codetasks.sandbox import bwrap
from composer_jax.codetasks.synthesis import generator, sources
from tests.codetasks.mini_project import FAST, MINI, write_project


@pytest.fixture(scope="session")
def mini_root(tmp_path_factory) -> Path:
  return write_project(tmp_path_factory.mktemp("mini") / "minipkg-1.0", MINI)


@pytest.fixture(scope="session")
def mini_gen(mini_root, tmp_path_factory):
  """A prepared generator over the mini project and the tasks it made (verify on)."""
  if why := bwrap.available():
    pytest.skip(why)
  work = tmp_path_factory.mktemp("work")
  src = sources.resolve(str(mini_root), work)
  cfg = generator.Config(
    seed=0, max_tasks=2, baseline_runs=1, validation_runs=2, limits=FAST, max_f2p_fraction=0.7
  )
  gen = generator.Generator(src, work, cfg)
  return gen, gen.generate()


@pytest.fixture(scope="session")
def hypot_task(mini_gen):
  by_name = {t.features[0]["qualname"]: t for t in mini_gen[1]}
  return by_name["hypot_scaled"]
