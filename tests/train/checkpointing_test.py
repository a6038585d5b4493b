"""Checkpoints from elsewhere: a newest step a newer orbax wrote falls back to the previous
good step in one line; a `checkpoints` path that is a file is refused when opened."""

import json
import os

import grain
import numpy as np
import pytest

from composer_jax.model.config import get_preset
from composer_jax.train import checkpointing, loop

_CFG = get_preset("tiny", hidden_size=32)


def _save(workdir, steps):
  ckpt = checkpointing.Checkpointer(str(workdir), keep=5)
  for s in steps:
    data = iter(grain.MapDataset.range(4).to_iter_dataset())
    ckpt.save(s, {"x": np.full(2, s, np.float32)}, data, _CFG, {})
  ckpt.close()


def _from_newer_orbax(workdir, step):
  """Step metadata as a newer orbax might write it: fields this orbax does not know."""
  path = os.path.join(workdir, "checkpoints", str(step), "_CHECKPOINT_METADATA")
  with open(path) as f:
    meta = json.load(f)
  meta.update(orbax_version="9.0.0", item_metadata_v2={"state": {"format": "future"}})
  with open(path, "w") as f:
    json.dump(meta, f)
  return path


def _restore_newest(workdir):
  ckpt = checkpointing.Checkpointer(str(workdir), keep=5)
  try:
    restore = lambda s: ckpt.restore(s, {"x": np.zeros(2, np.float32)})
    return loop.restore_newest(_CFG, ckpt, restore, str(workdir))
  finally:
    ckpt.close()


def test_newest_step_from_a_newer_orbax_falls_back_to_the_previous_one(tmp_path, caplog):
  _save(tmp_path, [1, 2])
  path = _from_newer_orbax(tmp_path, 2)
  with caplog.at_level("WARNING"):
    state = _restore_newest(tmp_path)
  np.testing.assert_array_equal(state["x"], [1, 1])
  line = next(r.getMessage() for r in caplog.records if "checkpoint step 2:" in r.getMessage())
  assert f"{path} does not read with orbax" in line and "falling back to step 1" in line
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2.corrupt"]  # kept, aside


def test_only_step_from_a_newer_orbax_is_one_line_saying_what_to_do(tmp_path):
  _save(tmp_path, [3])
  path = _from_newer_orbax(tmp_path, 3)
  with pytest.raises(checkpointing.CorruptCheckpointError) as e:
    checkpointing.Checkpointer(str(tmp_path), keep=5)
  assert f"checkpoint step 3: {path} does not read" in str(e.value)
  assert "upgrade orbax-checkpoint" in str(e.value) and "\n" not in str(e.value)
  assert os.listdir(tmp_path / "checkpoints") == ["3"]  # nothing moved


def test_checkpoints_path_that_is_a_file_is_refused_on_open(tmp_path):
  (tmp_path / "checkpoints").write_text("not a directory")
  with pytest.raises(checkpointing.CheckpointSaveError, match=r"checkpoints: it is a regular file"):
    checkpointing.Checkpointer(str(tmp_path), keep=5)
  assert (tmp_path / "checkpoints").read_text() == "not a directory"
