"""rl.sd_probes against a float64 numpy reference, and the SD term alone closing the probe gap."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from scipy import special

from composer_jax.envs.toolcall import probe_contexts
from composer_jax.model import transformer
from composer_jax.model.config import model_config
from composer_jax.rl import sd_probes
from composer_jax.rl.config import default_loss_config
from composer_jax.rl.teacher import DistillTarget
from composer_jax.rl.trajectory import Trajectory, Turn
from composer_jax.rl.update import make_update
from experiments.configs import rl_tool_feedback
from experiments.tool_feedback import program

D, V = 12, 11


_log_softmax = functools.partial(special.log_softmax, axis=-1)


@functools.cache
def _probe_data():
  turns = lambda tool: [Turn([1, 3, 4, 5]), Turn([6, tool, 2], [-0.5] * 3)]
  trajs = [Trajectory.from_turns(turns(t), 0.0, i) for i, t in enumerate((7, 8, 9))]
  targets = [DistillTarget(0, 1, (10, 3)), DistillTarget(1, 1, (10, 4)), DistillTarget(2, 1, (5,))]
  return sd_probes.build_probe_set(
    trajs, targets, [1, 1, 1], [3, 4, 5], seq_len=8, teacher_seq_len=10, turn_len=3
  )


@pytest.mark.parametrize("teacher_kind", ["frozen", "trust_region"])
def test_probe_metrics_match_numpy(teacher_kind):
  ps = _probe_data()
  cfg = default_loss_config()
  cfg.update(
    vocab_chunk_size=4,
    skip_first_tokens=1,
    teacher=teacher_kind,
    trust_region_alpha=0.3,
    divergence="jsd",
    support="sampled",
    sd_is_clip=2.0,
    sd_normalization="batch_tokens",
  )  # probes ignore these
  rng = np.random.default_rng(0)
  arr = lambda *s: rng.normal(size=s).astype(np.float32)
  h, hh, w = arr(3, 8, D), arr(3, 10, D), arr(D, V)
  teacher = ((arr(3, 10, D), arr(D, V)),) + (
    ((arr(3, 10, D), arr(D, V)),) if teacher_kind == "trust_region" else ()
  )
  got = jax.jit(functools.partial(sd_probes.probe_metrics, ml_collections.FrozenConfigDict(cfg)))(
    h, hh, w, teacher, ps
  )
  # Reference: rows 'call TOOL <eot>' after a 4-token system turn; stream index 4 'call',
  # 5 TOOL, 6 <eot>; logits at i predict i + 1. Teacher stream: system + hint + turn.
  mix = (1.0,) if teacher_kind == "frozen" else (0.7, 0.3)
  kls, ref = [], {k: [] for k in ("bad", "good", "bad_hint", "good_hint", "teacher_good")}
  for r, (hint_len, good) in enumerate([(2, 3), (2, 4), (1, 5)]):
    bad = [7, 8, 9][r]
    for j in (1, 2):  # slot 0 ('call') skipped
      s_pos, t_pos = 4 + j - 1, 4 + hint_len + j - 1
      p = _log_softmax(np.float64(h[r, s_pos]) @ w)
      q = _log_softmax(
        sum(m * (np.float64(th[r, t_pos]) @ tw) for m, (th, tw) in zip(mix, teacher, strict=True))
      )
      kls.append((np.exp(p) * (p - q)).sum())
      if j == 1:
        ph = _log_softmax(np.float64(hh[r, t_pos]) @ w)
        for k, v in dict(
          bad=p[bad], good=p[good], bad_hint=ph[bad], good_hint=ph[good], teacher_good=q[good]
        ).items():
          ref[k].append(np.exp(v))
  np.testing.assert_allclose(got["probe_kl"], np.mean(kls), rtol=1e-5)
  for k, v in ref.items():
    name = "probe_teacher_p_good" if k == "teacher_good" else f"probe_p_{k}"
    np.testing.assert_allclose(got[name], np.mean(v), rtol=1e-5, err_msg=name)


def test_term_grad_stats_by_hand():
  a = {"x": jnp.array([3.0, 0.0]), "y": jnp.array([[4.0]])}
  b = {"x": jnp.array([0.0, 2.0]), "y": jnp.array([[0.0]])}
  s = sd_probes.term_grad_stats(a, jax.tree.map(lambda u, v: u + v, a, b))
  np.testing.assert_allclose(s["rl_grad_norm"], 5.0)
  np.testing.assert_allclose(s["sd_grad_norm"], np.sqrt(9 + 4 + 16))
  np.testing.assert_allclose(s["rl_sd_grad_cos"], 25 / (5 * np.sqrt(29)), rtol=1e-6)
  zero = jax.tree.map(jnp.zeros_like, a)
  assert float(sd_probes.term_grad_stats(a, zero)["rl_sd_grad_cos"]) == 0.0


def test_probe_slots_must_be_sampled_tokens():
  turns = [Turn([1, 3]), Turn([6, 7, 2], [-0.5] * 3)]
  with pytest.raises(ValueError, match="probe_slots"):
    sd_probes.build_probe_set(
      [Trajectory.from_turns(turns, 0.0, 0)],
      [DistillTarget(0, 1, (5,))],
      [3],
      [4],
      seq_len=8,
      teacher_seq_len=8,
      turn_len=4,
    )


@pytest.mark.slow
def test_sd_term_alone_closes_the_probe_gap():
  """RL off (one group, equal rewards: every advantage 0), the probe contexts themselves as the
  SD batch, a frozen teacher (another init, so the gap starts large): each update of the real
  RL step must lower the probe KL."""
  config = rl_tool_feedback.get_config("sd")
  model_cfg, env = model_config(config.model), program.make_env(config)
  variables = transformer.init(model_cfg, jax.random.key(0))
  r = config.rl
  ps = probe_contexts.probe_set(
    env,
    np.random.default_rng(123),
    8,
    seq_len=r.seq_len,
    teacher_seq_len=r.teacher_seq_len,
    turn_len=r.max_new_tokens,
  )
  batch = dict(ps["batch"], group_index=np.zeros(8, np.int32), reward=np.ones(8, np.float32))
  tb = {k: v for k, v in ps["teacher_batch"].items() if k not in ("probe_slot", "good_id")}
  loss_cfg = ml_collections.FrozenConfigDict(config.loss)
  tx = optax.adam(1e-3)
  update = jax.jit(make_update(model_cfg, loss_cfg, tx)[0])
  probe = jax.jit(sd_probes.make_probe_fn(model_cfg, loss_cfg))
  params, router = variables["params"], variables["router"]
  initial = (transformer.init(model_cfg, jax.random.key(1))["params"],)
  opt_state, kls = tx.init(params), []
  for _ in range(5):
    kls.append(float(probe(params, router, initial, ps)["probe_kl"]))
    params, opt_state, metrics = update(params, opt_state, router, batch, initial, tb)
    np.testing.assert_allclose(metrics["rl_loss"], 0.0, atol=1e-7)
  kls.append(float(probe(params, router, initial, ps)["probe_kl"]))
  assert kls[0] > 0.01, kls
  assert all(b < a for a, b in zip(kls, kls[1:])), kls
  assert kls[-1] < 0.5 * kls[0], kls


def _gap_trajs():
  """Group 0: a failure (its turn 3 flagged), a success (model turns 1, 3) and a second
  success; group 1: a lone flagged failure (no sibling succeeds)."""
  turns = lambda a, b: [Turn([1, 3]), Turn([6, a], [-0.5] * 2), Turn([4]), Turn([6, b], [-0.7] * 2)]
  return [
    Trajectory.from_turns(turns(7, 8), 0.0, 0),
    Trajectory.from_turns(turns(7, 9), 1.0, 0),
    Trajectory.from_turns(turns(8, 9), 1.0, 0),
    Trajectory.from_turns(turns(8, 8), 0.0, 1),
  ]


def test_gap_targets_pick_the_successful_siblings_corresponding_turn():
  trajs = _gap_trajs()
  flagged = [DistillTarget(0, 3, (10,)), DistillTarget(3, 1, (11,)), DistillTarget(1, 1, (12,))]
  got = sd_probes.gap_targets(flagged, trajs, success_reward=1.0, limit=8)
  # Row 0's 2nd model turn -> the first other success (row 1), its 2nd model turn (3); row 3 has
  # no successful sibling; row 1 (itself a success) reads row 2, never itself.
  assert got == [DistillTarget(1, 3, (10,)), DistillTarget(2, 1, (12,))]
  assert sd_probes.gap_targets(flagged, trajs, success_reward=1.0, limit=1) == got[:1]


def test_teacher_gap_against_a_hand_computation():
  rng = np.random.default_rng(3)
  rows, lk, v = 4, 3, 5
  # Per slot: student and teacher logits chosen directly (hidden = one-hot rows, head = logits).
  zs, zt = rng.normal(size=(rows, lk, v)), rng.normal(size=(rows, lk, v))
  targets = rng.integers(0, v, size=(rows, lk))
  slot_mask = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], np.float32)
  gap_row = np.array([0, 1, 1, 1], np.float32)
  n = rows * lk
  eye = np.eye(n, dtype=np.float32)
  tb = dict(
    student_row=np.zeros(rows, np.int32),
    slot_student_pos=np.arange(n, dtype=np.int32).reshape(rows, lk),
    slot_teacher_pos=np.tile(np.arange(lk, dtype=np.int32), (rows, 1))
    + 3 * np.arange(rows)[:, None],
    slot_target=targets.astype(np.int32),
    slot_mask=slot_mask,
    gap_row=gap_row,
  )
  # Teacher row t reads positions 3t..3t+2 of its own [T, n] hidden rows (slot_teacher_pos).
  teacher_hidden = np.broadcast_to(eye, (rows, n, n))
  cfg = default_loss_config()
  cfg.update(skip_first_tokens=1, vocab_chunk_size=2)
  got = sd_probes.teacher_gap(
    ml_collections.FrozenConfigDict(cfg),
    eye[None],
    zs.reshape(n, v).astype(np.float32),
    ((teacher_hidden, zt.reshape(n, v).astype(np.float32)),),
    tb,
  )
  lp, lq = _log_softmax(zs), _log_softmax(zt)
  d = np.take_along_axis(lq - lp, targets[..., None], -1)[..., 0]
  # Slot 0 of every turn skipped; row 3 then has no token; rows 1 (1 token) and 2 (2 tokens).
  per_row = [d[1, 1], d[2, 1:].mean()]
  np.testing.assert_allclose(got["teacher_gap"], np.mean(per_row), rtol=1e-5)
  np.testing.assert_allclose(got["teacher_gap_se"], np.std(per_row, ddof=1) / np.sqrt(2), rtol=1e-5)
  assert got["teacher_gap_rows"] == 2
  np.testing.assert_allclose(got["teacher_gap_flagged"], d[0, 1:].mean(), rtol=1e-5)
  only_gap = dict(tb, gap_row=np.ones(rows, np.float32))
  args = (eye[None], zs.reshape(n, v).astype(np.float32))
  teacher = ((teacher_hidden, zt.reshape(n, v).astype(np.float32)),)
  cfg = ml_collections.FrozenConfigDict(cfg)
  # Finite without SD rows (records compare bit-exact on resume).
  assert sd_probes.teacher_gap(cfg, *args, teacher, only_gap)["teacher_gap_flagged"] == 0
