"""Every red-team test: nothing written outside the sandbox, every grader temp dir removed."""

import os
import tempfile

import pytest

from composer_jax.envs.coding import runner
from tests.envs.coding.redteam.attacks import MARKERS


@pytest.fixture(autouse=True)
def nothing_written_outside(tmp_path, monkeypatch):
  runner.runtime_binds()  # the per-process pycache tree exists before the guard starts
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
