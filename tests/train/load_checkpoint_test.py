"""train.load_checkpoint: every checkpoint layout gives back the variables that were saved."""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from composer_jax.hf import checkpoint as hf_checkpoint
from composer_jax.hf import writer
from composer_jax.model import config as model_config
from composer_jax.model import transformer
from composer_jax.train import load_checkpoint

CFG = model_config.get_preset("tiny", num_layers=2)


@pytest.fixture(scope="module")
def variables():
  return jax.tree.map(np.asarray, transformer.init(CFG, jax.random.key(3)))


def _assert_same(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  jax.tree.map(np.testing.assert_array_equal, got, want)


def _workdir(path, items, state, cfg=CFG):
  """A run's checkpoint as its driver writes one: orbax items under checkpoints/<step>."""
  mngr = ocp.CheckpointManager(str(path / "checkpoints"), item_names=items + ("config",),
                               options=ocp.CheckpointManagerOptions(create=True))
  for step in (5, 10):  # the newest is read
    bumped = jax.tree.map(lambda x, s=step: x + s, state)
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(bumped),
                                            config=ocp.args.JsonSave({"model": cfg.to_dict(),
                                                                      "run": {}})))
  mngr.wait_until_finished()
  mngr.close()


def test_imported(tmp_path, variables):
  hf_checkpoint.save(str(tmp_path), CFG, variables)
  cfg, got = load_checkpoint.load(str(tmp_path))
  assert load_checkpoint.kind(str(tmp_path)) == "imported" and cfg == CFG
  _assert_same(got, variables)


def test_hugging_face_directory(tmp_path, variables):
  flat = {tuple(k.key for k in kp): v for kp, v in
          jax.tree_util.tree_flatten_with_path(variables)[0]}
  writer.export_hf(CFG, flat.__getitem__, str(tmp_path), dtype="float32")
  cfg, got = load_checkpoint.load(str(tmp_path))
  assert load_checkpoint.kind(str(tmp_path)) == "hf"
  assert cfg.hidden_size == CFG.hidden_size and cfg.num_layers == CFG.num_layers
  _assert_same(got, variables)


def test_training_workdir_newest_step(tmp_path, variables):
  state = {"step": np.int32(0), "params": variables["params"], "router": variables["router"],
           "opt_state": {"mu": np.zeros(3, np.float32)}, "rng": np.zeros(2, np.uint32)}
  _workdir(tmp_path, ("state", "data"), state)
  cfg, got = load_checkpoint.load(str(tmp_path))
  assert cfg == CFG
  _assert_same(got, jax.tree.map(lambda x: x + 10, variables))


def test_rl_workdir_needs_a_router_for_moe(tmp_path, variables):
  _workdir(tmp_path, ("state", "rng"), {"params": variables["params"], "opt_state": {}})
  with pytest.raises(ValueError, match="has no router bias"):
    load_checkpoint.load(str(tmp_path))


def test_rl_workdir_of_a_dense_model(tmp_path):
  dense = CFG.replace(first_k_dense_replace=CFG.num_layers)
  params = jax.tree.map(np.asarray, transformer.init(dense, jax.random.key(0)))["params"]
  _workdir(tmp_path, ("state", "rng"), {"params": params, "opt_state": {}}, cfg=dense)
  cfg, got = load_checkpoint.load(str(tmp_path))
  assert cfg == dense and got["router"] == {}
  _assert_same(got["params"], jax.tree.map(lambda x: x + 10, params))


@pytest.mark.parametrize("layout", ["empty", "config_only"])
def test_not_a_checkpoint_is_one_line(tmp_path, layout):
  if layout == "config_only":
    (tmp_path / "config.json").write_text("{}")
  with pytest.raises(ValueError, match="is none of: an imported checkpoint"):
    load_checkpoint.load(str(tmp_path))
