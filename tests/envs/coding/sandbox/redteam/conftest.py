"""Every red-team test: nothing written outside the sandbox, every grader temp dir removed."""

import os
import tempfile

import pytest

from composer_jax.envs.coding import sandbox
from composer_jax.envs.coding.sandbox import runner
from tests.envs.coding.sandbox.redteam.attacks import MARKERS


@pytest.fixture(autouse=True)
def nothing_written_outside(tmp_path, monkeypatch):
  sandbox.require()  # the per-process /etc and pycache trees exist before the guard starts
  runner.runtime_binds()
  for m in MARKERS:
    if os.path.exists(m):
      os.unlink(m)
  host_tmp = tmp_path / "grader-tmp"
  host_tmp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(host_tmp))
  yield
  monkeypatch.undo()
  assert [m for m in MARKERS if os.path.exists(m)] == []
  assert sorted(p.name for p in host_tmp.iterdir()) == []  # temp dirs removed, nothing left
