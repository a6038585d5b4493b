"""Colocated vs disaggregated RL (4 trainer + 4 sampler devices of 8), staleness, bad input, and
which weights the RL step runs the SD teacher with.

Disaggregated with max_staleness 0 must reproduce the colocated run (same episodes, losses and
params); with staleness 1 the sampler plays batch k + 1 with the weights of step k, and the
steps log their staleness and truncated importance weights (which differ from 1 once the
weights that sampled differ from the ones trained).
"""

from unittest import mock

import chex
import jax
import numpy as np
import pytest
from scipy import special

from composer_jax.model import transformer
from composer_jax.model.config import model_config
from composer_jax.rl import run as rl_run
from composer_jax.rl import steps as rl_steps
from composer_jax.rl.programs import update_program
from composer_jax.train import load_checkpoint
from experiments.configs import rl_tool_feedback
from tests.rl.toy_env import ToyEnv

STEPS = 3
TRAINER = 4  # devices 0-3 (layout fsdp, mesh.fsdp=4); the sampler's are 4-7 when disaggregated


def _config(mode="colocated", staleness=0):
  c = rl_tool_feedback.get_config("sd,layout=fsdp")
  c.mesh.fsdp = TRAINER
  c.train.steps = STEPS
  c.optim.lr = c.optim.adam_lr = 1e-2  # large steps: stale weights sample differently
  c.rl.update(
    dict(
      groups=2,
      group_size=2,
      seq_len=8,
      prompt_len=4,
      teacher_seq_len=16,
      teacher_rows=4,
      mode=mode,
      max_staleness=staleness,
      probe_count=0,
      gap_rows=0,
      sampler_devices=(4, 5, 6, 7) if mode == "disaggregated" else (),
    )
  )
  return c


def _run(config, workdir):
  """(per-step records without wall-clock times, final params) of an RL run from a random
  init."""
  init = jax.device_get(transformer.init(model_config(config.model), jax.random.key(0)))
  records = rl_run.run(config, str(workdir), ToyEnv(), init)
  rows = [{k: v for k, v in r.items() if "seconds" not in k and "bytes" not in k} for r in records]
  return rows, load_checkpoint.load(str(workdir))[1]["params"]


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
  return _run(_config(), tmp_path_factory.mktemp("colocated"))


@pytest.mark.slow
def test_disaggregated_with_staleness_0_equals_colocated(colocated, tmp_path):
  rows, params = _run(_config("disaggregated", 0), tmp_path)
  assert [r["staleness"] for r in rows] == [0.0] * STEPS
  assert rows == colocated[0]  # same episodes, rewards, losses and metrics: float equality
  chex.assert_trees_all_equal(params, colocated[1])


@pytest.mark.slow  # a few CPU seconds beside `colocated` (same compiled update and sampler)
def test_a_stopped_run_resumes_bit_exact(colocated, tmp_path):
  """Stopped after step 1 of 3 (its schedule still 3 steps long) and run again in the same
  workdir: the same episodes, losses and final params as the uninterrupted run, whose weights
  move (unlike tests/rl/run_test's, whose 3-step warm-up earns no reward: its updates are 0)."""
  first_config = _config()
  first_config.optim.total_steps, first_config.train.steps = STEPS, 1
  first, _ = _run(first_config, tmp_path)
  rest, params = _run(_config(), tmp_path)
  assert [r["step"] for r in first] == [1] and [r["step"] for r in rest] == [2, 3]
  assert first + rest == colocated[0]
  assert any(r["grad_norm"] > 0 for r in colocated[0])
  chex.assert_trees_all_equal(params, colocated[1])


@pytest.mark.slow
def test_staleness_1_samples_with_the_previous_weights(colocated, tmp_path):
  rows, _ = _run(_config("disaggregated", 1), tmp_path)
  # Batch 0 waits for the initial weights; batch k >= 1 was sampled with step k - 1's.
  assert [r["staleness"] for r in rows] == [0.0, 1.0, 1.0]
  assert rows[0] == colocated[0][0]
  # Importance weights min(pi_theta / pi_sampler, C) are logged; off-policy they move off 1.
  assert rows[0]["tis_weight"] == pytest.approx(1.0, abs=1e-5)
  assert all(abs(r["tis_weight"] - 1.0) > 1e-4 for r in rows[1:])


@pytest.mark.parametrize(
  "change,message",
  [
    (
      dict(mode="disaggregated", sampler_devices=(2, 3, 4, 5)),
      "rl.mode='disaggregated': sampler devices (2, 3, 4, 5) overlap the trainer's devices "
      "(0, 1, 2, 3) (layout 'fsdp') on [2, 3]",
    ),
    (dict(mode="disaggregated", max_staleness=-1), "rl.max_staleness=-1 must be >= 0"),
    (dict(max_staleness=1), "rl.max_staleness=1 needs rl.mode='disaggregated'"),
    (dict(mode="disaggregated", sampler_devices=()), "rl.sampler_devices=() must be distinct"),
    (dict(mode="async"), "rl.mode='async'; valid: ('colocated', 'disaggregated')"),
  ],
)
def test_bad_mode_settings_are_one_line(change, message):
  config = _config()
  config.rl.update(change)
  with pytest.raises(ValueError) as e:
    rl_run.validate(config)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_trajectory_longer_than_the_sampler_cache_is_one_line(tmp_path):
  config = _config()
  config.mesh.fsdp = 1
  config.rl.prompt_len = 2  # the first turn has 3 tokens
  init = jax.device_get(transformer.init(model_config(config.model), jax.random.key(0)))
  with pytest.raises(
    ValueError,
    match=r"an episode history has \d+ tokens > prompt_len 2; "
    r"raise prompt_len",
  ) as e:
    rl_run.run(config, str(tmp_path), ToyEnv(), init)
  assert "\n" not in str(e.value)


def _recorded_runs(kinds, init, workdir):
  """{kind: (config, calls, rows)}: 2 steps of the colocated run of `_config()` with
  `loss.teacher = kind`; `calls`: per step, what the real step passed to the update (params, batch, teacher
  params, teacher batch); `rows`: the step's logged metrics. The update does not depend on the
  teacher kind (the step passes the teacher's weights in), so all kinds share `_config()`'s
  compiled update (the `colocated` run's, in the same process)."""
  prog = update_program(_config(), model_config(_config().model))
  out = {}
  for kind in kinds:
    config, calls, rows = _config(), [], []
    config.train.steps = 2  # step 1 is the first whose ema / frozen teachers differ from live
    config.loss.teacher = kind

    def update(params, opt_state, router, batch, teacher_params, teacher_batch, calls=calls):
      calls.append(jax.device_get((params, batch, teacher_params, teacher_batch)))
      return prog.update(params, opt_state, router, batch, teacher_params, teacher_batch)

    recorded = prog._replace(update=update)
    with mock.patch.object(rl_steps, "update_program", lambda *_, p=recorded: p):
      rows += rl_run.run(config, str(workdir / kind), ToyEnv(), init)
    out[kind] = config, calls, rows
  return out


_forward = jax.jit(transformer.forward, static_argnums=0)


def _hand_sd_loss(config, router, params, batch, teacher_params, teacher_batch):
  """float64 numpy SD term: KL(student || teacher) (the report's direction), the student =
  the model at `params` on the batch rows, the teacher = the model at `teacher_params` on its
  rows (the hint before the turn); summed over the turn's sampled tokens from
  `skip_first_tokens` on, divided by the batch's model tokens (`sd_normalization`
  'batch_tokens', RL's token count)."""
  cfg = model_config(config.model)

  def log_probs(p, b):
    h, _ = _forward(
      cfg, {"params": p, "router": router}, b["tokens"], b["segment_ids"], b["positions"]
    )
    z = np.asarray(h, np.float64) @ np.asarray(transformer.output_head(cfg, p), np.float64)
    return z - special.logsumexp(z, axis=-1, keepdims=True)

  student, teacher = log_probs(params, batch), log_probs(teacher_params, teacher_batch)
  terms = []
  for t, j in zip(*np.nonzero(teacher_batch["slot_mask"]), strict=True):
    if j >= config.loss.skip_first_tokens:
      p = student[teacher_batch["student_row"][t], teacher_batch["slot_student_pos"][t, j]]
      q = teacher[t, teacher_batch["slot_teacher_pos"][t, j]]
      terms.append(np.sum(np.exp(p) * (p - q)))
  assert terms, "no distilled tokens"
  assert config.loss.sd_normalization == "batch_tokens"
  return np.sum(terms) / (batch["model_mask"] * batch["valid"][:, None]).sum()


@pytest.mark.slow  # ~40 s of CPU alone; less beside `colocated` (same update and sampler)
def test_sd_teacher_is_the_model_itself_with_the_hint(tmp_path):
  """The report's teacher, as the RL step wires it: 'live' runs on the very weights being
  trained, 'ema' on their EMA (ema <- ema + rate (theta - ema) after each update, from the
  initial weights), 'frozen' on the initial weights; each on rows with the hint inserted
  before the flagged turn. (No gradient reaches the teacher: the update's stop_gradient, and
  `losses_test.py::test_teacher_gets_no_gradient_and_env_padding_tokens_do_nothing`.)"""
  init = jax.device_get(transformer.init(model_config(_config().model), jax.random.key(0)))
  runs = _recorded_runs(("live", "ema", "frozen"), init, tmp_path)
  params = [c[0] for c in runs["live"][1]]
  embedding = lambda p: p["embed"]["embedding"]
  # The weights move (else live == ema == frozen would pass trivially), and all kinds see the
  # same first batch (same tasks and sampling keys).
  assert not np.allclose(embedding(params[-1]), embedding(init["params"]))
  for kind in ("ema", "frozen"):
    np.testing.assert_array_equal(runs[kind][1][0][1]["tokens"], runs["live"][1][0][1]["tokens"])
  same = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
  for p, (_, _, teacher, _) in zip(params, runs["live"][1], strict=True):
    same(teacher, (p,))
  for _, _, teacher, _ in runs["frozen"][1]:
    same(teacher, (init["params"],))
  ema_rate, ema = runs["ema"][0].loss.ema_rate, init["params"]
  for step, (p, _, teacher, _) in enumerate(runs["ema"][1]):
    if step:  # the EMA after the previous update, towards the weights it produced (= p)
      ema = jax.tree.map(lambda e, q: e + ema_rate * (q - e), ema, p)
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), teacher, (ema,)
    )
  assert not np.allclose(embedding(ema), embedding(init["params"]))
  assert not np.allclose(embedding(ema), embedding(p))
  # Hint inserted: the toy env's prompt is [1, t, 2], its hint [t, t] (tests/rl/toy_env.py).
  tb = runs["live"][1][1][3]
  rows = tb["slot_mask"].sum(-1) > 0
  assert rows.any()
  np.testing.assert_array_equal(tb["tokens"][rows, 3], tb["tokens"][rows, 1])
  np.testing.assert_array_equal(tb["tokens"][rows, 4], tb["tokens"][rows, 1])
  # The logged SD term is KL(student || teacher) of the whole models at those weights (the
  # teacher's own forward and head, hand-computed here) on the turn's tokens after the
  # first, after step 0 (where ema and frozen teachers differ from the trained weights).
  # (The direction on divergences large enough to tell it apart: losses_test.py.)
  for kind, (config, calls, logged) in runs.items():
    for step in range(1, config.train.steps):
      params, batch, (teacher,), tb = calls[step]
      np.testing.assert_allclose(
        logged[step]["sd_loss"],
        _hand_sd_loss(config, init["router"], params, batch, teacher, tb),
        rtol=1e-3,
        err_msg=f"{kind} step {step}",
      )
