"""Real PyPI source (network): skipped unless CJ_NETWORK_TESTS=1. The full run is
experiments/bench/coding_tasks.py."""

import os

import pytest

from composer_jax.envs.coding import generator, grader, sources


@pytest.mark.network
@pytest.mark.skipif(not os.environ.get("CJ_NETWORK_TESTS"), reason="set CJ_NETWORK_TESTS=1")
def test_inflection_task_from_pypi(tmp_path):
  src = sources.resolve("inflection==0.5.1", tmp_path)
  assert src.archive_sha256 == next(
    p["sha256"] for p in sources.load_manifest() if p["name"] == "inflection"
  )
  gen = generator.Generator(src, tmp_path, generator.Config(max_tasks=1, baseline_runs=1))
  (task,) = gen.generate()
  assert grader.grade(task, task.gold_patch).reward == 1.0
  assert grader.grade(task, "").reward == 0.0
