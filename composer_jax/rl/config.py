"""RL settings with defaults: `default_config()` (sampling, batch shapes, modes) and
`default_loss_config()` (every choice of the RL + self-distillation loss). Both are sections of
the one run-config schema (`experiments/configs/base.py`: `config.rl`, `config.loss`); the RL step
count, seed, logging, checkpoints and optimizer are the schema's `train` and `optim`."""

from __future__ import annotations

import ml_collections

from composer_jax.train.config import Range

_INT0 = Range(0, integer=True)
_INT1 = Range(1, integer=True)

# Valid ranges of `config.rl` (`train.config.check_ranges`); `loss` is `losses.validate`'s.
RANGES = {
  "rl.groups": _INT1,
  "rl.group_size": Range(
    2, integer=True, note="group-relative advantages of a group of 1 are 0: no reward signal"
  ),
  "rl.seq_len": _INT1,
  "rl.prompt_len": _INT1,
  "rl.max_new_tokens": _INT1,
  "rl.temperature": Range(0, note="0 = greedy"),
  "rl.top_p": Range(0, 1, lo_open=True, note="1 = no nucleus truncation"),
  "rl.teacher_seq_len": _INT1,
  "rl.teacher_rows": _INT1,
  "rl.epochs": _INT1,
  "rl.minibatches": _INT1,
  "rl.max_staleness": Range(0, integer=True, note="0 = on-policy"),
  "rl.probe_count": Range(0, integer=True, note="0 = off"),
  "rl.probe_every": _INT1,
  "rl.gap_rows": Range(0, integer=True, note="0 = no teacher-gap rows"),
}


def default_config() -> ml_collections.ConfigDict:
  """Defaults of `config.rl` (`rl.steps`, `rl.rollout`): small enough for a CPU."""
  c = ml_collections.ConfigDict()
  c.groups = 16  # tasks per step, each played group_size times (GRPO groups)
  c.group_size = 4
  c.seq_len = 48  # packed trajectory length (tokens)
  c.prompt_len = 40  # the sampler's prompt buffer: an episode's history must fit
  c.max_new_tokens = 3  # per model turn; the sampler's KV cache holds prompt_len + this - 1
  c.temperature = 1.0
  c.top_p = 1.0
  c.teacher_seq_len = 48  # teacher rows: prefix + hint + turn
  c.teacher_rows = 64  # flagged turns beyond this are dropped (and counted)
  # Teacher rows hold only hint + turn over the student's prefix KV cache (`rl.teacher`): the
  # teacher's cost grows with hint + turn, not with the trajectory. teacher_seq_len is then
  # the extension length (1 + hint + turn).
  c.teacher_prefix_reuse = False
  # K epochs of M minibatches per batch (`rl.epochs`, PPO): ratio pi_theta / pi_old != 1 after
  # the first update, so the clip acts; 1 x 1 = one update per batch (ratio 1).
  c.epochs = 1
  c.minibatches = 1
  # 'colocated': sample then train on the same devices; 'disaggregated': a sampler thread on
  # `sampler_devices` (disjoint from the trainer's mesh) samples batch k + 1 while the trainer
  # trains on batch k, with weights at most `max_staleness` steps old (`rl.rollout`).
  c.mode = "colocated"
  c.sampler_devices = ()
  c.max_staleness = 0
  # Probes (`rl.sd_probes`): `probe_count` held-out flagged contexts from the environment's
  # `probe_set` (0 = off), measured after every `probe_every`-th step.
  c.probe_count = 0
  c.probe_every = 1
  # The teacher gap (`rl.sd_probes.teacher_gap`): up to `gap_rows` probe-only teacher rows per
  # batch (successful siblings' turns with the flagged turn's hint; 0 = off), also without SD.
  # An episode succeeds when its reward >= success_reward (also the demonstrations of
  # `loss.sd_variant` 'sdpo').
  c.gap_rows = 0
  c.success_reward = 1.0
  return c


def default_loss_config() -> ml_collections.ConfigDict:
  """Defaults: DAPO-style clipped policy gradient + reverse-KL self-distillation, EMA teacher."""
  c = ml_collections.ConfigDict()
  # Chunking: at most [token_chunk_size (or all tokens), vocab_chunk_size] float32 logits live.
  c.vocab_chunk_size = 8192
  c.token_chunk_size = 0  # 0: all tokens of a term in one block
  # --- RL term over all model tokens (losses.policy_loss) ---
  c.clip_eps_low = 0.2  # ratio clipped below at 1 - eps_low
  c.clip_eps_high = 0.28  # clip-higher (DAPO, arXiv 2503.14476)
  c.advantage_std_normalize = True  # False: Dr. GRPO
  c.advantage_eps = 1e-6
  c.rl_normalization = "token_mean"  # 'sequence_mean' | 'token_mean' (DAPO) | 'constant' (Dr. GRPO)
  c.rl_constant = 0.0  # divisor for 'constant'; 0 = batch rows * sequence length
  c.tis_cap = 2.0  # truncated importance weight min(pi_old / pi_sampler, C); 0 disables
  c.ref_kl_coef = 0.0  # KL to a reference policy; 0 = off
  c.ref_kl_estimator = "k2"  # 'k1' | 'k2' | 'k3' (see losses.kl_estimate)
  # Log the norms of the RL and SD gradients and their cosine (`rl.sd_probes.term_grad_stats`):
  # a second backward pass.
  c.log_term_grads = False
  c.turn_penalty = 0.0  # dense reward -c on flagged turns' tokens (the per-turn baseline); 0 = off
  # --- self-distillation term on target-turn tokens (divergences.token_divergence) ---
  c.sd_coef = 1.0  # beta in total = RL + beta * SD
  c.divergence = "reverse_kl"  # 'reverse_kl' | 'forward_kl' | 'jsd'
  c.jsd_beta = 0.5
  c.support = "full"  # 'full' | 'topk' (student top-K + tail bucket) | 'sampled' (reverse_kl)
  c.top_k = 20
  c.teacher = "ema"  # 'live' | 'ema' | 'frozen' | 'trust_region' (teacher_weights)
  c.ema_rate = 0.02
  c.trust_region_alpha = 0.5
  c.skip_first_tokens = 0  # do not distill the first n sampled tokens of a turn (hint leakage)
  # 'batch_tokens': the SD sum / all active model tokens of the batch (RL's token_mean
  # denominator: one per-token scale for both terms); 'token_mean' / distilled tokens only (the
  # committed tool-calling figures up to 2026-12-05); or rl_normalization's other choices.
  c.sd_normalization = "batch_tokens"
  c.sd_constant = 0.0  # 0 = teacher rows * slots per row
  # 'hint' | 'sdpo' | 'rlvr' (`rl.sd_variants`): what the teacher reads, how it enters the loss.
  c.sd_variant = "hint"
  c.sd_demo_tokens = 48  # 'sdpo': the successful sibling's model tokens shown to the teacher
  c.sd_is_clip = 0.0  # SD token weight min(pi_theta / pi_sampler, c) (SDPO: 2); 0 = off
  c.rlvr_weight_clip = 2.0  # 'rlvr': advantage weights in [1/c, c]
  return c
