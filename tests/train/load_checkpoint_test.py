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


def _workdir(path, items, state, cfg=CFG, run=None):
  """A run's checkpoint as its driver writes one: orbax items under checkpoints/<step>."""
  mngr = ocp.CheckpointManager(
    str(path / "checkpoints"),
    item_names=items + ("config",),
    options=ocp.CheckpointManagerOptions(create=True),
  )
  for step in (5, 10):  # the newest is read
    bumped = jax.tree.map(lambda x, s=step: x + s, state)
    mngr.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(bumped),
        config=ocp.args.JsonSave({"model": cfg.to_dict(), "run": run or {}}),
      ),
    )
  mngr.wait_until_finished()
  mngr.close()


def test_imported(tmp_path, variables):
  hf_checkpoint.save(str(tmp_path), CFG, variables)
  cfg, got = load_checkpoint.load(str(tmp_path))
  assert load_checkpoint.kind(str(tmp_path)) == "imported" and cfg == CFG
  _assert_same(got, variables)


def test_hugging_face_directory(tmp_path, variables):
  flat = {
    tuple(k.key for k in kp): v for kp, v in jax.tree_util.tree_flatten_with_path(variables)[0]
  }
  writer.export_hf(CFG, flat.__getitem__, str(tmp_path), dtype="float32")
  cfg, got = load_checkpoint.load(str(tmp_path))
  assert load_checkpoint.kind(str(tmp_path)) == "hf"
  assert cfg.hidden_size == CFG.hidden_size and cfg.num_layers == CFG.num_layers
  _assert_same(got, variables)


def test_training_workdir_newest_step(tmp_path, variables):
  state = {
    "step": np.int32(0),
    "params": variables["params"],
    "router": variables["router"],
    "opt_state": {"mu": np.zeros(3, np.float32)},
    "rng": np.zeros(2, np.uint32),
  }
  _workdir(tmp_path, ("state", "data"), state)
  cfg, got = load_checkpoint.load(str(tmp_path))
  assert cfg == CFG
  _assert_same(got, jax.tree.map(lambda x: x + 10, variables))


def _biased(variables, value):
  return {
    **variables,
    "router": jax.tree.map(lambda b: np.full_like(b, value), variables["router"]),
  }


@pytest.mark.parametrize("start", ["random_init", "init_from", "warmup"])
def test_rl_workdir_router_is_the_one_the_run_started_from(tmp_path, variables, start):
  """RL saves params only: the router bias comes from where the run started."""
  run, want = {"train": {"init_from": ""}}, variables["router"]  # a fresh init: zeros
  if start == "init_from":
    init = _biased(variables, 0.25)
    hf_checkpoint.save(str(tmp_path / "imported"), CFG, init)
    run, want = {"train": {"init_from": str(tmp_path / "imported")}}, init["router"]
  elif start == "warmup":
    # As the programs save it: a Checkpointer workdir (coding: the whole TrainState).
    warm = {**_biased(variables, -0.5), "opt_state": {}}
    _workdir(tmp_path / "run" / "warmup", ("state", "data"), warm)
    want = jax.tree.map(lambda x: x + 10, warm["router"])  # its newest step
  _workdir(
    tmp_path / "run", ("state", "data"), {"params": variables["params"], "opt_state": {}}, run=run
  )
  cfg, got = load_checkpoint.load(str(tmp_path / "run"))
  assert cfg == CFG
  _assert_same(got["router"], want)
  _assert_same(got["params"], jax.tree.map(lambda x: x + 10, variables["params"]))


@pytest.mark.parametrize("layout", ["empty", "config_only"])
def test_not_a_checkpoint_is_one_line(tmp_path, layout):
  if layout == "config_only":
    (tmp_path / "config.json").write_text("{}")
  with pytest.raises(ValueError, match="is none of: an imported checkpoint"):
    load_checkpoint.load(str(tmp_path))
