"""End-to-end trainer behaviour: resume bit-exactness, NaN stop, config mismatch, metrics."""

import json
import math
import os
import struct

import chex
import jax
import numpy as np
import pytest

from composer_jax import data
from composer_jax.hf import checkpoint as hf_checkpoint
from composer_jax.model import transformer
from composer_jax.model.config import model_config
from composer_jax.train import checkpointing, loop, programs
from experiments.configs import base
from tests.experiments.plot_test import plot_cli, write_rl_workdir
from tests.train.conftest import TOTAL_STEPS, tiny_config


def _losses(records):
  return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_resume_is_bit_exact(full_run, tmp_path):
  _, full = full_run
  workdir = str(tmp_path)
  first = loop.train(tiny_config(steps=3), workdir)
  second = loop.train(tiny_config(), workdir)
  assert sorted(_losses(first)) == [1, 2, 3] and sorted(_losses(second)) == [4, 5, 6]
  resumed = {**_losses(first), **_losses(second)}
  assert resumed == _losses(full)  # float equality, every step
  assert second[-1]["eval_loss"] == full[-1]["eval_loss"]


def test_losses_drop_and_are_finite(full_run):
  losses = _losses(full_run[1])
  assert all(math.isfinite(v) for v in losses.values())
  assert losses[TOTAL_STEPS] < losses[1]


def test_metrics_files(full_run):
  workdir, records = full_run
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    lines = [json.loads(line) for line in f]
  assert [r["step"] for r in lines] == list(range(1, TOTAL_STEPS + 1))
  expected = {
    "step",
    "tokens",
    "loss",
    "ce",
    "z_loss",
    "logz_sq",
    "grad_norm",
    "update_norm",
    "lr",
    "tokens_per_s",
    "moe/load_max_over_mean",
    "moe/router_entropy",
    "update_rms/muon",
    "update_rms/adamw",
  }
  assert expected <= set(lines[0])
  assert lines[0]["startup_s"] > 0 and not any("startup_s" in r for r in lines[1:])
  assert "eval_loss" in lines[2] and "eval_loss" in lines[-1]
  assert lines[-1]["tokens"] == TOTAL_STEPS * 4 * 32
  assert lines == json.loads(json.dumps(records))
  events = os.listdir(os.path.join(workdir, "tensorboard"))
  assert any(e.startswith("events.out.tfevents") for e in events)


def test_plot_command_renders_the_run(full_run, tmp_path):
  """`experiments.plot` on this run and an RL workdir: one PNG, a panel per logged metric."""
  workdir, _ = full_run
  rl = write_rl_workdir(tmp_path / "rl")
  out = str(tmp_path / "fig" / "runs.png")
  proc = plot_cli(workdir, rl, f"--out={out}")
  assert proc.returncode == 0, proc.stderr
  titles = "training loss, validation loss, learning rate, gradient norm, reward, flagged turns"
  rates = "unavailable rate, verbose rate"
  assert proc.stdout.strip() == f"Wrote {out}: {titles}, {rates} of 2 run(s)"
  with open(out, "rb") as f:
    png = f.read()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
  # 8 panels: 3 columns x 3 rows of 5 x 3.4 inches at 100 dpi; drawn curves, not a blank canvas.
  assert struct.unpack(">II", png[16:24]) == (1500, 1020) and len(png) > 30_000
  lm_only = str(tmp_path / "lm.png")
  proc = plot_cli(workdir, f"--out={lm_only}", "--x=tokens", "--smooth=0.5")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip().endswith(
    ": training loss, validation loss, learning rate, gradient norm of 1 run(s)"
  )
  with open(lm_only, "rb") as f:
    assert struct.unpack(">II", f.read(24)[16:24]) == (1000, 680)  # 4 panels: 2 x 2


def test_checkpoints_hold_full_state(full_run):
  workdir, _ = full_run
  ckpt = checkpointing.Checkpointer(workdir, keep=3)
  assert ckpt.all_steps() == [3, 6]
  config = tiny_config()
  progs = programs.programs(config, model_config(config.model))
  restored_it = data.make_iterator(config.data, seq_len=32, batch_size=4, seed=config.train.seed)
  state = ckpt.restore(6, progs.target, restored_it)
  ckpt.close()
  assert int(state.step) == 6
  chex.assert_trees_all_equal_shapes_and_dtypes(state, progs.target)
  it = data.make_iterator(config.data, seq_len=32, batch_size=4, seed=config.train.seed)
  for _ in range(6):
    next(it)
  chex.assert_trees_all_equal(next(restored_it), next(it))  # the 7th batch comes next
  bias = np.asarray(state.router["moe_layers"]["moe"]["bias"])
  assert np.any(bias != 0)  # the router-bias update ran


def test_different_model_config_is_rejected(full_run):
  workdir, _ = full_run
  config = tiny_config()
  config.model.hidden_size = 128
  with pytest.raises(
    ValueError,
    match=r"different model config: hidden_size \(checkpoint 64, "
    r"config 128\)",
  ):
    loop.train(config, workdir)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  workdir = str(tmp_path)
  loop.train(tiny_config(steps=3), workdir)  # good checkpoint at step 3
  config = tiny_config(nan_at_step=4)
  with pytest.raises(loop.NonFiniteLossError, match="Non-finite training loss/update at step 4"):
    loop.train(config, workdir)
  ckpt = checkpointing.Checkpointer(workdir, keep=3)
  assert ckpt.all_steps() == [3]
  good = tiny_config()
  state = ckpt.restore(3, programs.programs(good, model_config(good.model)).target)
  ckpt.close()
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(state.params)))


def test_empty_data_path_is_rejected(tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  config = tiny_config()
  config.data.paths = str(empty)
  with pytest.raises(ValueError, match="has no"):
    loop.train(config, str(tmp_path / "work"))


@pytest.mark.slow
def test_sharded_run_matches_single_device(tmp_path):
  """8 fake devices, FSDP + expert parallel: same losses as one device (up to reduction order)."""
  single = tiny_config(steps=2, batch_size=8, eval_every=0)
  sharded = tiny_config(steps=2, batch_size=8, eval_every=0)
  base.set_layout(sharded, "fsdp_ep")
  a = _losses(loop.train(single, str(tmp_path / "single")))
  b = _losses(loop.train(sharded, str(tmp_path / "sharded")))
  np.testing.assert_allclose([b[1], b[2]], [a[1], a[2]], rtol=1e-5)


def test_init_from_imported_checkpoint(full_run, tmp_path):
  """Starting from an import_hf-format checkpoint of the seed-0 init reproduces the
  random-init run exactly; a checkpoint of another architecture is refused."""
  config = tiny_config()
  model_cfg = model_config(config.model)
  init_key, _ = jax.random.split(jax.random.PRNGKey(config.train.seed))  # as state.init_state
  imported = str(tmp_path / "imported")
  hf_checkpoint.save(imported, model_cfg, jax.device_get(transformer.init(model_cfg, init_key)))
  records = loop.train(tiny_config(init_from=imported), str(tmp_path / "run"))
  assert _losses(records) == _losses(full_run[1])

  other = str(tmp_path / "other")
  other_cfg = model_cfg.replace(num_heads=2)
  hf_checkpoint.save(other, other_cfg, jax.device_get(transformer.init(other_cfg, init_key)))
  with pytest.raises(
    ValueError,
    match=r"init_from=.*different model config: num_heads "
    r"\(checkpoint 2, config 4\)",
  ):
    loop.train(tiny_config(init_from=other), str(tmp_path / "run2"))


class _CountingSteps:
  """A `loop.Steps` whose step k's metrics are a device scalar; logs when each step is dispatched."""

  def __init__(self, events):
    self.events = events

  def step(self, state, step):
    self.events.append(("step", step + 1))
    return state + 1, {"loss": jax.numpy.asarray(float(step + 1))}

  def record(self, step, metrics, state):
    return {"step": step, **metrics}  # unfetched: the driver fetches it later

  def checkpoint(self, state):
    return {"x": np.zeros(2, np.float32)}, {"n": int(state)}


def test_drive_fetches_each_steps_metrics_after_the_next_step_is_dispatched(tmp_path, monkeypatch):
  """LM and RL runs alike: the host never waits for step k's metrics before step k + 1 is
  queued (except to save a checkpoint: a non-finite state is never saved)."""
  events = []
  get = jax.device_get

  def device_get(tree):
    events.append(("fetch", float(jax.tree.leaves(tree)[0])))
    return get(tree)

  monkeypatch.setattr(jax, "device_get", device_get)
  ckpt = checkpointing.Checkpointer(str(tmp_path), keep=1)
  records = loop.drive(
    _CountingSteps(events),
    0,
    0,
    ckpt,
    workdir=str(tmp_path),
    total_steps=4,
    ckpt_every=2,
    console_every=1,
    model_cfg=model_config(base.get_base_config().model),
    run_config={},
  )
  assert [r["step"] for r in records] == [1, 2, 3, 4] and records[2]["loss"] == 3.0
  fetched = [e for e in events if e[0] == "fetch" and e[1] in (1.0, 2.0, 3.0, 4.0)]
  order = [e for e in events if e[0] == "step" or e in fetched]
  # Step 1's metrics (and record) after step 2 is queued; step 2's before its checkpoint.
  assert order[:5] == [("step", 1), ("step", 2), ("fetch", 1.0), ("fetch", 1.0), ("fetch", 2.0)], (
    order
  )
  assert order.index(("step", 4)) < order.index(("fetch", 3.0))
