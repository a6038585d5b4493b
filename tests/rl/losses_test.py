"""Tests for composer_jax.rl.losses against an independent float64 numpy reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from composer_jax.rl import losses
from composer_jax.rl.config import default_loss_config
from composer_jax.rl.teacher import DistillTarget, build_teacher_batch
from composer_jax.rl.trajectory import Trajectory, Turn, pack_batch

D, V = 16, 13


_log_softmax = functools.partial(special.log_softmax, axis=-1)


@functools.cache
def _data():
  rng = np.random.default_rng(0)
  lp = lambda n: list(-rng.uniform(0.1, 3.0, n))
  turns = lambda a, b: [
    Turn([1, 2, 3]),
    Turn([4, 5, 6, 7][:a], lp(a)),
    Turn([8, 9]),
    Turn([10, 11, 12, 2][:b], lp(b)),
  ]
  trajs = [
    Trajectory.from_turns(turns(4, 3), 1.0, 7),
    Trajectory.from_turns(turns(2, 4), 0.0, 7),
    Trajectory.from_turns(turns(3, 2), 0.5, 7),
    Trajectory.from_turns(turns(4, 4), 2.0, 3),
  ]
  batch = pack_batch(trajs, buckets=[16], batch_size=5)
  targets = [DistillTarget(0, 3, [20, 21]), DistillTarget(0, 1, [22]), DistillTarget(3, 3, [23])]
  tb = build_teacher_batch(trajs, batch, targets, buckets=[16], turn_buckets=[4], num_rows=4)
  arr = lambda *s: rng.normal(size=s).astype(np.float32)
  batch["old_logprobs"] = np.where(batch["model_mask"] > 0, -rng.uniform(0.1, 3.0, (5, 16)), 0)
  batch["old_logprobs"] = batch["old_logprobs"].astype(np.float32)
  model = dict(
    h=arr(5, 16, D),
    w=arr(D, V),
    th=arr(4, 16, D),
    th0=arr(4, 16, D),
    w0=arr(D, V),
    rh=arr(5, 16, D),
    rw=arr(D, V),
  )
  # Teacher row 0 is sure of every sampled token of its turn (D > V: logits are solvable).
  for j in np.flatnonzero(tb["slot_mask"][0]):
    want = 8.0 * np.eye(V)[tb["slot_target"][0, j]]
    model["th"][0, tb["slot_teacher_pos"][0, j]] = np.linalg.lstsq(model["w"].T, want, rcond=None)[
      0
    ]
  return batch, tb, model


def _np_normalize(x, mask, kind, constant):
  x = np.where(mask > 0, x, 0.0)
  if kind == "token_mean":
    return x.sum() / max(mask.sum(), 1)
  if kind == "sequence_mean":
    rows = [x[r].sum() / mask[r].sum() for r in range(len(x)) if mask[r].sum() > 0]
    return np.mean(rows)
  return x.sum() / (constant or mask.size)


def _np_rlvr_weights(cfg, batch, tb, m, adv):
  """Self-distilled RLVR's [B, L] advantage weights, by the formula (losses.advantage_weights)."""
  f = lambda x: np.asarray(x, np.float64)
  weights = np.ones(batch["targets"].shape)
  for t, j in zip(*np.nonzero(tb["slot_mask"])):
    if j < cfg.skip_first_tokens or tb.get("gap_row", np.zeros(len(tb["slot_mask"])))[t]:
      continue
    row, pos, y = tb["student_row"][t], tb["slot_student_pos"][t, j], tb["slot_target"][t, j]
    p = _log_softmax(f(m["h"][row, pos]) @ f(m["w"]))[y]
    q = _log_softmax(f(m["th"][t, tb["slot_teacher_pos"][t, j]]) @ f(m["w"]))[y]
    c = np.log(cfg.rlvr_weight_clip)
    weights[row, pos] *= np.exp(np.clip(cfg.sd_coef * np.sign(adv[row]) * (q - p), -c, c))
  return weights


def _np_loss(cfg, batch, tb, m, use_old):
  """Straight-line float64 reference of RL + sd_coef * SD (reverse KL, full vocabulary; with
  sd_is_clip the clipped importance weight per token; 'rlvr': reweighted advantages, no SD)."""
  f = lambda x: np.asarray(x, np.float64)
  b, length = batch["targets"].shape
  logp_all = _log_softmax(f(m["h"]) @ f(m["w"]))
  logp = np.take_along_axis(logp_all, batch["targets"][..., None], -1)[..., 0]
  adv = np.zeros(b)
  for g in set(batch["group_index"][batch["valid"] > 0].tolist()):
    idx = [i for i in range(b) if batch["group_index"][i] == g and batch["valid"][i] > 0]
    r = f(batch["reward"][idx])
    std = r.std() + cfg.advantage_eps if cfg.advantage_std_normalize else 1.0
    adv[idx] = (r - r.mean()) / std
  old = f(batch["old_logprobs"]) if use_old else logp
  w = np.exp(logp - old)
  a = adv[:, None]
  if cfg.sd_variant == "rlvr":
    a = a * _np_rlvr_weights(cfg, batch, tb, m, adv)
  surr = np.minimum(w * a, np.clip(w, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high) * a)
  tis = np.minimum(np.exp(old - batch["sampler_logprobs"]), cfg.tis_cap) if cfg.tis_cap else 1.0
  mask = batch["model_mask"] * batch["valid"][:, None]
  rl = _np_normalize(-tis * surr, mask, cfg.rl_normalization, cfg.rl_constant)
  tok = lambda x: np.broadcast_to(x, mask.shape)[mask > 0]
  is_w = np.exp(old - batch["sampler_logprobs"])
  clip = ((a < 0) & (w < 1 - cfg.clip_eps_low)) | ((a > 0) & (w > 1 + cfg.clip_eps_high))
  off_policy = dict(
    clip_frac=tok(clip).mean(),
    ratio_mean=tok(w).mean(),
    ratio_max=tok(w).max(),
    is_weight_mean=tok(is_w).mean(),
    is_weight_max=tok(is_w).max(),
    is_truncated_frac=(tok(is_w) > cfg.tis_cap).mean() if cfg.tis_cap else 0.0,
    tis_weight=tok(tis).mean(),
  )
  if cfg.ref_kl_coef:
    ref = np.take_along_axis(
      _log_softmax(f(m["rh"]) @ f(m["rw"])), batch["targets"][..., None], -1
    )[..., 0]
    d = logp - ref
    k = {"k1": d, "k2": d**2 / 2, "k3": np.exp(-d) + d - 1}[cfg.ref_kl_estimator]
    rl += cfg.ref_kl_coef * _np_normalize(k, mask, cfg.rl_normalization, cfg.rl_constant)
  div, sd_mask, hits = np.zeros(tb["slot_mask"].shape), np.zeros(tb["slot_mask"].shape), []
  is_w = np.ones(tb["slot_mask"].shape)
  gap = tb.get("gap_row", np.zeros(len(tb["slot_mask"])))
  for t, j in zip(*np.nonzero(tb["slot_mask"])):
    if j < cfg.skip_first_tokens or gap[t]:
      continue
    zs = f(m["h"][tb["student_row"][t], tb["slot_student_pos"][t, j]]) @ f(m["w"])
    zt = f(m["th"][t, tb["slot_teacher_pos"][t, j]]) @ f(m["w"])
    if cfg.teacher == "trust_region":
      zt0 = f(m["th0"][t, tb["slot_teacher_pos"][t, j]]) @ f(m["w0"])
      zt = (1 - cfg.trust_region_alpha) * zt0 + cfg.trust_region_alpha * zt
    p, q = _log_softmax(zs), _log_softmax(zt)
    div[t, j], sd_mask[t, j] = (np.exp(p) * (p - q)).sum(), 1.0
    hits.append(zt.argmax() == tb["slot_target"][t, j])
    if cfg.sd_is_clip:  # the sampler's log-prob at the student position of this token
      y = tb["slot_target"][t, j]
      sampler = batch["sampler_logprobs"][tb["student_row"][t], tb["slot_student_pos"][t, j]]
      is_w[t, j] = min(np.exp(p[y] - sampler), cfg.sd_is_clip)
  metrics = dict(sd_gap_kl=div.sum() / sd_mask.sum(), teacher_accuracy=np.mean(hits), **off_policy)
  if cfg.sd_is_clip:
    metrics["sd_is_weight"] = is_w[sd_mask > 0].mean()
    div = div * is_w
  if cfg.sd_normalization == "batch_tokens":  # SD sum / every model token of the batch
    sd = div[sd_mask > 0].sum() / mask.sum()
  else:
    sd = _np_normalize(div, sd_mask, cfg.sd_normalization, cfg.sd_constant)
  if cfg.sd_variant == "rlvr":  # no SD term; the teacher only reweighted the advantages
    return rl, rl, None, {k: v for k, v in off_policy.items()}
  return rl + cfg.sd_coef * sd, rl, sd, metrics


CASES = {
  # Defaults: RL over all model tokens (DAPO), SD summed over the distilled tokens / the same
  # count ('batch_tokens'); the last teacher row a probe-only gap row.
  "token_mean": dict(gap=True),
  # The old SD scale (/ distilled tokens only), SDPO's importance-weight clip.
  "sd_token_mean_is_clip": dict(sd_normalization="token_mean", sd_is_clip=1.1, sd_coef=0.7),
  # Self-distilled RLVR: the teacher reweights the flagged tokens' advantages.
  "rlvr": dict(sd_variant="rlvr", sd_coef=2.0, rlvr_weight_clip=1.5, gap=True),
  "sequence_mean_dr_grpo_skip": dict(
    rl_normalization="sequence_mean",
    sd_normalization="sequence_mean",
    advantage_std_normalize=False,
    skip_first_tokens=1,
    tis_cap=0.0,
  ),
  "constant_trust_region_refkl": dict(
    rl_normalization="constant",
    rl_constant=40.0,
    sd_normalization="constant",
    teacher="trust_region",
    trust_region_alpha=0.3,
    ref_kl_coef=0.1,
    ref_kl_estimator="k3",
    sd_coef=0.5,
    tis_cap=1.5,
  ),
}


@functools.cache
def _loss_fn(case):
  cfg = default_loss_config()
  case_cfg = {k: v for k, v in CASES[case].items() if k != "gap"}
  cfg.update(dict(vocab_chunk_size=5, teacher="live", tis_cap=2.0) | case_cfg)
  return cfg, losses.make_loss_fn(cfg)


def _call(case, m, batch, tb, use_old=True):
  cfg, fn = _loss_fn(case)
  teacher = (
    ((m["th0"], m["w0"]), (m["th"], m["w"]))
    if cfg.teacher == "trust_region"
    else ((m["th"], m["w"]),)
  )
  batch = batch if use_old else {k: v for k, v in batch.items() if k != "old_logprobs"}
  return fn(m["h"], m["w"], batch, teacher, tb, (m["rh"], m["rw"]) if cfg.ref_kl_coef else None)


@pytest.mark.parametrize("case", list(CASES))
def test_loss_matches_numpy(case):
  batch, tb, m = _data()
  cfg, _ = _loss_fn(case)
  if CASES[case].get("gap"):  # teacher row 2 probes the teacher gap only: never distilled
    tb = dict(tb, gap_row=np.array([0, 0, 1, 0], np.float32))
  for use_old in (True, False) if case == "token_mean" else (True,):
    loss, metrics = _call(case, m, batch, tb, use_old)
    total, rl, sd, sd_metrics = _np_loss(cfg, batch, tb, m, use_old)
    np.testing.assert_allclose(loss, total, rtol=1e-4)
    np.testing.assert_allclose(
      metrics["rl_loss"] + cfg.ref_kl_coef * metrics.get("ref_kl", 0), rl, rtol=1e-4
    )
    if sd is not None:
      np.testing.assert_allclose(metrics["sd_loss"], sd, rtol=1e-4)
    for name, value in sd_metrics.items():
      np.testing.assert_allclose(metrics[name], value, rtol=1e-4, atol=1e-7, err_msg=name)
  assert metrics["num_model_tokens"] == batch["model_mask"].sum()
  gap = tb.get("gap_row", np.zeros(len(tb["slot_mask"])))
  distilled = tb["slot_mask"][:, cfg.skip_first_tokens :] * (1 - gap)[:, None]
  assert metrics["num_distilled_tokens"] == distilled.sum()
  assert 0 < metrics["sd_token_frac"] < 1
  if cfg.sd_variant == "rlvr":  # the weights move the RL loss, by a bounded amount
    plain, _ = _loss_fn(case)[1](m["h"], m["w"], batch)
    assert abs(float(loss) - float(plain)) > 1e-5
    assert abs(metrics["rlvr_weight_mean"] - 1) > 0.05 and "sd_loss" not in metrics
    w = metrics["rlvr_weight_mean"]  # the weights are clipped to [1 / 1.5, 1.5]
    assert w <= 1.5 and w >= 1 / 1.5
  else:
    assert 0 < metrics["teacher_accuracy"] < 1
  if case == "token_mean":  # RL only: the same RL value without a teacher
    rl_only, _ = _loss_fn(case)[1](m["h"], m["w"], batch)
    np.testing.assert_allclose(rl_only, _np_loss(cfg, batch, tb, m, True)[1], rtol=1e-4)


@functools.cache
def _grad_fn(case):
  _, fn = _loss_fn(case)
  f = lambda h, w, th, tw, batch, tb: fn(h, w, batch, ((th, tw),), tb)[0]
  return jax.jit(jax.grad(f, argnums=(0, 1, 2, 3)))


def _grads(case, m, batch, tb):
  return _grad_fn(case)(m["h"], m["w"], m["th"], m["w"], batch, tb)


def test_teacher_gets_no_gradient_and_env_padding_tokens_do_nothing():
  batch, tb, m = _data()
  g_h, g_w, g_th, g_tw = _grads("token_mean", m, batch, tb)
  np.testing.assert_array_equal(g_th, 0.0)
  np.testing.assert_array_equal(g_tw, 0.0)
  assert np.abs(g_h).sum() > 0 and np.abs(g_w).sum() > 0
  # Perturb every environment / padding position: hidden, targets, sampler log-probs, and the
  # teacher's hidden states outside the distilled slots.
  env = batch["model_mask"] == 0
  rng = np.random.default_rng(1)
  m2 = dict(m, h=np.where(env[..., None], rng.normal(size=m["h"].shape), m["h"]).astype(np.float32))
  slots = np.zeros(m["th"].shape[:2], bool)
  slots[np.arange(4)[:, None], tb["slot_teacher_pos"]] = tb["slot_mask"] > 0
  m2["th"] = np.where(slots[..., None], m["th"], 5.0).astype(np.float32)
  batch2 = dict(
    batch,
    targets=np.where(env, 12, batch["targets"]),
    sampler_logprobs=np.where(env, -9.0, batch["sampler_logprobs"]).astype(np.float32),
    reward=np.where(batch["valid"] > 0, batch["reward"], 100.0).astype(np.float32),
  )
  np.testing.assert_allclose(
    _call("token_mean", m2, batch2, tb)[0], _call("token_mean", m, batch, tb)[0], rtol=1e-6
  )
  g2 = _grads("token_mean", m2, batch2, tb)
  np.testing.assert_array_equal(np.asarray(g_h)[env], 0.0)
  np.testing.assert_allclose(g2[0], g_h, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(g2[1], g_w, rtol=1e-5, atol=1e-7)


def test_chunking_does_not_change_loss_or_grads():
  batch, tb, m = _data()
  cfg = default_loss_config()
  cfg.update(teacher="live", vocab_chunk_size=4, token_chunk_size=7, support="topk", top_k=3)
  chunked = losses.make_loss_fn(cfg)
  cfg.update(vocab_chunk_size=V, token_chunk_size=0)
  whole = losses.make_loss_fn(cfg)
  run = lambda fn: jax.jit(
    jax.value_and_grad(lambda h, w: fn(h, w, batch, ((m["th"], m["w"]),), tb)[0], argnums=(0, 1))
  )(m["h"], m["w"])
  (la, ga), (lb, gb) = run(chunked), run(whole)
  np.testing.assert_allclose(la, lb, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), ga, gb)


def test_clip_higher_at_the_boundaries():
  lo, hi, d = 0.2, 0.28, 1e-3
  ratio = np.array([1 + hi - d, 1 + hi + d, 1 - lo + d, 1 - lo - d] * 2)
  adv = np.array([1.0] * 4 + [-1.0] * 4)
  f = lambda lp: losses.policy_loss(
    lp, jnp.zeros(8), jnp.zeros(8), adv, eps_low=lo, eps_high=hi, tis_cap=0.0
  )
  loss, stats = jax.jit(f)(np.log(ratio))
  low, high = stats["clipped_low"], stats["clipped_high"]
  grad = jax.jit(jax.grad(lambda lp: f(lp)[0].sum()))(jnp.log(ratio))
  np.testing.assert_allclose(
    loss, -np.minimum(ratio * adv, np.clip(ratio, 1 - lo, 1 + hi) * adv), rtol=1e-6
  )
  # d(-w A)/d log w = -w A where the unclipped branch is active; 0 where the clip holds.
  active = np.array([1, 0, 1, 1, 1, 1, 1, 0], bool)
  np.testing.assert_allclose(grad, np.where(active, -ratio * adv, 0.0), rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(high, [0, 1, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(low, [0, 0, 0, 0, 0, 0, 0, 1])


def test_tis_weight_is_capped_and_has_no_gradient():
  old, sampler = jnp.array([-1.0, -1.0]), jnp.array([-1.5, -4.0])
  f = lambda o: losses.policy_loss(
    o, o, sampler, jnp.ones(2), eps_low=0.2, eps_high=0.28, tis_cap=2.0
  )
  _, stats = f(old)
  tis = stats["tis"]
  np.testing.assert_allclose(tis, [np.exp(0.5), 2.0], rtol=1e-6)
  np.testing.assert_allclose(stats["is_weight"], [np.exp(0.5), np.exp(3.0)], rtol=1e-6)
  np.testing.assert_array_equal(stats["truncated"], [0.0, 1.0])
  # loss = -tis * w * A with w = exp(logp - sg(old)) -> gradient -tis (tis itself constant).
  g = jax.grad(
    lambda lp: losses.policy_loss(
      lp, jax.lax.stop_gradient(lp), sampler, jnp.ones(2), eps_low=0.2, eps_high=0.28, tis_cap=2.0
    )[0].sum()
  )(old)
  np.testing.assert_allclose(g, -np.asarray(tis), rtol=1e-6)


def test_kl_estimators_values_and_expected_gradients():
  """Exact expectations over a 5-way categorical: the documented loss properties of k1/k2/k3."""
  z = jnp.array([0.3, -1.0, 2.0, 0.5, -0.2])
  ref = jax.nn.log_softmax(jnp.array([1.0, 0.0, -1.0, 0.5, 0.1]))
  d = np.asarray(jax.nn.log_softmax(z) - ref)
  for est, value in [("k1", d), ("k2", d**2 / 2), ("k3", np.exp(-d) + d - 1)]:
    np.testing.assert_allclose(
      losses.kl_estimate(jax.nn.log_softmax(z), ref, est), value, rtol=1e-5, atol=1e-7
    )

  def expected_grad(est):  # sum_y pi(y) grad_z k(y), pi under stop_gradient (on-policy samples)
    f = lambda z: (
      jax.lax.stop_gradient(jax.nn.softmax(z)) * losses.kl_estimate(jax.nn.log_softmax(z), ref, est)
    ).sum()
    return jax.jit(jax.grad(f))(z)

  rev = jax.grad(lambda z: (jax.nn.softmax(z) * (jax.nn.log_softmax(z) - ref)).sum())(z)
  fwd = jax.grad(lambda z: (jnp.exp(ref) * (ref - jax.nn.log_softmax(z))).sum())(z)
  np.testing.assert_allclose(expected_grad("k1"), 0.0, atol=1e-6)
  np.testing.assert_allclose(expected_grad("k2"), rev, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(expected_grad("k3"), fwd, rtol=1e-5, atol=1e-6)
  assert not np.allclose(fwd, rev, atol=1e-2)


@pytest.mark.parametrize("kind", losses.NORMALIZATIONS)
def test_normalize(kind):
  x = np.arange(12.0).reshape(3, 4)
  mask = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], np.float32)
  np.testing.assert_allclose(
    losses.normalize(x, mask, kind, 0.0),
    {"token_mean": 39 / 6, "sequence_mean": (0.5 + 9.5) / 2, "constant": 39 / 12}[kind],
    rtol=1e-6,
  )


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("rl_normalization", "mean", "rl_normalization='mean'"),
    ("support", "all", "support='all'"),
    ("jsd_beta", 1.0, "jsd_beta=1.0"),
    ("clip_eps_low", 1.0, "clip_eps_low=1.0"),
    ("ref_kl_estimator", "k4", "ref_kl_estimator='k4'"),
  ],
)
def test_bad_config(field, value, match):
  cfg = default_loss_config()
  cfg[field] = value
  with pytest.raises(ValueError, match=match):
    losses.make_loss_fn(cfg)


def test_missing_inputs_raise():
  batch, tb, m = _data()
  _, fn = _loss_fn("constant_trust_region_refkl")
  with pytest.raises(ValueError, match="ref_kl_coef > 0 needs ref"):
    fn(m["h"], m["w"], batch, ((m["th0"], m["w0"]), (m["th"], m["w"])), tb)
  with pytest.raises(ValueError, match="pass both teacher and teacher_batch"):
    fn(m["h"], m["w"], batch, ((m["th"], m["w"]),), None, (m["rh"], m["rw"]))
  with pytest.raises(ValueError, match="needs 2 \\(hidden, head\\) pairs, got 1"):
    fn(m["h"], m["w"], batch, ((m["th"], m["w"]),), tb, (m["rh"], m["rw"]))
