"""RL with targeted text feedback on the tool-calling environment (`composer_jax.rl.run`).

    python -m experiments.run --config=experiments/configs/rl_tool_feedback.py:sd

runs one arm in `workdir/rl_tool_feedback` (warm-up, then RL with metrics, checkpoints and
resume through the shared driver: `experiments/tool_feedback/program.py`, `composer_jax.rl.run`);

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m experiments.run \
        --config=experiments/configs/rl_tool_feedback.py:sd,layout=cp2_ep8

the same arm on a named parallel layout (`layouts.py`). The config is an overlay on
`base.py`'s schema: RL steps, seed and checkpoints in `train`, the RL optimizer in `optim`, the
sampler, modes and probes in `rl`, the loss in `loss`; `env` and `warmup` are this program's own.

    python -m experiments.tool_feedback.sweep --workdir=workdir/text_feedback
    python -m experiments.figures.text_feedback --workdir=workdir/text_feedback

runs every arm of both behaviours for several seeds, then plots them. `get_config(arg)` (`base.parse_arg`:
'ARM[,behaviour=BEHAVIOUR][,layout=LAYOUT]', e.g. 'sd', 'penalty,behaviour=verbose'):
  arms       'rl'       beta = 0: RL only (GRPO/DAPO clipped policy gradient on the task reward);
             'sd'       RL + beta * SD, the self-distillation KL on the flagged turns, teacher =
                        the policy itself with the hint before that turn, as its EMA (the
                        report's teacher; `loss.ema_rate` 0.02);
             'penalty'  RL + a dense per-turn penalty: advantage A - c on the flagged turns'
                        tokens (`loss.turn_penalty` c = 1, about one advantage std);
             'both'     RL + SD + the penalty;
             'lr0'      RL at learning rate 0: the parameters never move, so its spread over
                        seeds and steps is the noise floor the other arms are read against.
             KIND[_VARIANT][_TEACHER][@SD_COEF]  an arm with that SD variant
                        (`composer_jax.rl.sd_variants`, `loss.sd_variant`): 'sd_hint' (= 'sd',
                        the per-turn hint teacher), 'sd_sdpo' (SDPO's reprompted teacher: hint
                        + a successful sibling's turns, SDPO's settings `SDPO`), 'sd_rlvr'
                        (self-distilled RLVR: the teacher reweights the flagged tokens'
                        advantages); that SD teacher (`composer_jax.rl.teacher_weights`): e.g.
                        'sd_live', 'sd_ema' (= 'sd'), 'sd_frozen' (the ablation),
                        'both_trust_region'; that `loss.sd_coef`: 'sd_hint@0.3'.
  The SD term is on RL's per-token scale (`loss.sd_normalization` 'batch_tokens'); the
  committed figures up to 2026-12-05 used 'token_mean' (`--config.loss.sd_normalization=
  token_mean` reproduces them).
  behaviours 'tools'    (default) the report's scenario: tasks of 8 tool calls (capabilities
                        with repeats) with a 20-turn budget, so a call to an unavailable tool
                        costs (almost) nothing in the reward; hint = the reminder listing every
                        available tool; the warm-up reads that full list when it is there.
             'verbose'  a style rule: the verbose answer `answer result CAP... <eot>`, which
                        never changes the reward; hint 'reminder: keep messages short'.
Ablations are config args of every arm (`--config.loss.X=...` through `python -m
experiments.run`): beta `loss.sd_coef`; divergence `loss.divergence` (reverse_kl, forward_kl,
jsd) x support `loss.support` (full, topk, sampled); teacher `loss.teacher` (frozen, ema, live,
trust_region); lr `optim.adam_lr`; `loss.skip_first_tokens`; the penalty `loss.turn_penalty`.
Every arm logs the probes (`rl.sd_probes`: held-out flagged contexts, `rl.probe_count`), the
teacher gap on each batch (`rl.gap_rows`: does the hinted teacher favour what successful
siblings did?) and the RL / SD gradient norms and cosine (`loss.log_term_grads`).

What the arms measured (the earlier setting and the full figure): RESULTS.md, "RL with
targeted text feedback".
"""

import ml_collections

from composer_jax import optim
from composer_jax.rl import sd_variants, teacher_weights
from experiments.configs import base

# arm kind -> (sd_coef, turn_penalty); 'lr0' is RL at learning rate 0 (the noise floor).
ARMS = {
  "rl": (0.0, 0.0),
  "lr0": (0.0, 0.0),
  "sd": (1.0, 0.0),
  "penalty": (0.0, 1.0),
  "both": (1.0, 1.0),
}
BEHAVIOURS = ("tools", "verbose")
# SDPO's published settings (arXiv 2601.20802, /work/shared/REFERENCE.md) for the 'sdpo' variant;
# top-K 20 of the 64-word vocabulary (SDPO: 100 of a full one).
SDPO = dict(divergence="jsd", jsd_beta=0.5, support="topk", top_k=20, ema_rate=0.05, sd_is_clip=2.0)


def split_arm(arm: str) -> tuple[str, str | None, str | None, float | None]:
  """'KIND[_VARIANT][_TEACHER][@SD_COEF]' -> (kind, SD variant, SD teacher, sd_coef), None where
  not given: 'sd_sdpo' -> ('sd', 'sdpo', None, None), 'sd_live' -> ('sd', None, 'live', None),
  'sd_hint@0.3' -> ('sd', 'hint', None, 0.3)."""
  name, at, coef = arm.partition("@")
  kind, *rest = name.split("_")
  variant = rest.pop(0) if rest and rest[0] in sd_variants.VARIANTS else None
  teacher = rest.pop(0) if rest and rest[0] in teacher_weights.TEACHERS else None
  value = None
  if at:
    try:
      value = float(coef)
    except ValueError:
      value = -1.0
  if kind not in ARMS or rest or (value is not None and not value >= 0):
    raise ValueError(
      f"arm={arm!r}; valid: KIND[_VARIANT][_TEACHER][@SD_COEF], KIND in {sorted(ARMS)}, "
      f"VARIANT in {sorted(sd_variants.VARIANTS)}, TEACHER in {teacher_weights.TEACHERS}, "
      "SD_COEF >= 0 (e.g. 'sd_sdpo', 'sd_live', 'sd_hint@0.3')"
    )
  return kind, variant, teacher, value


def get_config(arg=None):
  """`arg`: arm, behaviour and layout (module docstring; layout a named layout of `layouts.py`,
  'single' = one device)."""
  arg = base.parse_arg(arg, arm="sd", behaviour="tools", layout="single")
  arm, behaviour = arg.arm, arg.behaviour
  kind, variant, teacher, coef = split_arm(arm)
  if behaviour not in BEHAVIOURS:
    raise ValueError(f"behaviour={behaviour!r}; valid: {list(BEHAVIOURS)}")
  c = base.get_base_config()
  c.method = "rl"
  c.arm, c.behaviour = arm, behaviour
  # The tiny preset with the environment's word vocabulary (34 words, padded to 64).
  c.model.vocab_size = 64
  long = behaviour == "tools"
  c.env = ml_collections.ConfigDict(
    dict(
      name="toolcall",  # experiments.run.RL_EXPERIMENTS
      min_tools=3,
      max_tools=6,
      max_required=3,
      max_model_turns=20 if long else 4,
      first_alias_prob=0.8,
      calls_per_task=8 if long else 0,
    )
  )
  # The scripted agent ignores the tool list unless a hint shows it (envs/toolcall/warmup.py):
  # for 'tools' the full-list reminder, for 'verbose' the short-message one (and no tool hint
  # change: targeted, as before).
  c.warmup = ml_collections.ConfigDict(
    dict(
      steps=400,
      batch_size=32,
      seq_len=192 if long else 64,
      hint_prob=0.5,
      log_every=50,
      ckpt_every=100,
      router_bias_rate=1e-3,
      hint_all_tools=long,
      verbose_prob=0.0 if long else 0.5,
    )
  )
  c.warmup.optim = optim.default_config()  # total_steps 0: the warm-up's steps
  # RL: 80 steps, checkpoints (`composer_jax.rl.run`) every 20 steps, at the end and on SIGTERM.
  c.train.update(dict(steps=80, log_every=10, ckpt_every=20, keep=2, seed=0))
  if long:
    # Longest episode: system 1 + 1 + 6 + 1 + 8 + 1 = 18, then 20 turns of at most
    # 3 + 4 tokens: 158 (an answer ends it earlier). Teacher: prefix + full hint 9 + turn 3.
    # The budget leaves room for 11 unavailable calls, so an unavailable call costs (almost)
    # nothing in the reward (why 20 turns, not 16: RESULTS.md, the text-feedback figure).
    shapes = dict(groups=8, seq_len=160, prompt_len=160, teacher_seq_len=176, max_new_tokens=3)
  else:
    # Longest episode: 14 + 3 x (3 + 4) + 6 (the verbose answer) = 41 tokens.
    shapes = dict(groups=16, seq_len=48, prompt_len=48, teacher_seq_len=56, max_new_tokens=6)
  c.rl.update(
    dict(
      group_size=4,
      teacher_rows=64,
      temperature=1.0,
      top_p=1.0,
      probe_count=32,
      probe_every=1,
      gap_rows=32,
      **shapes,
    )
  )
  c.rl.feedback_kinds = ("unavailable_tool",) if long else ("overlong_message",)
  c.rl.feedback_options = (
    {"unavailable_tool": {"all_tools": True}} if long else {"overlong_message": {"max_tokens": 3}}
  )
  c.optim.update(
    dict(
      name="adamw",
      adam_lr=3e-4,
      schedule="wsd",
      warmup_steps=0,
      wsd_decay_fraction=0.0,
      grad_clip=1.0,
    )
  )
  c.loss.sd_coef, c.loss.turn_penalty = ARMS[kind]
  if coef is not None:
    c.loss.sd_coef = coef
  if kind == "lr0":
    c.optim.adam_lr = 0.0
  c.loss.sd_variant = variant or "hint"
  if variant == "sdpo":
    c.loss.update(SDPO)
    c.rl.teacher_seq_len += c.loss.sd_demo_tokens  # the demonstration sits before the turn
  c.loss.log_term_grads = True
  c.loss.vocab_chunk_size = 64
  # Distill the tool token and <eot> (after 'answer': 'result' or <eot>), not the first token,
  # which the hint context always predicts.
  c.loss.skip_first_tokens = 1
  # The report's teacher is the policy itself with the hint: its EMA, which a live teacher
  # is not stable enough for here (its hint reading can decay: RESULTS.md, "teacher kinds");
  # the frozen warmed-up model is the ablation ('sd_frozen').
  c.loss.teacher = teacher or "ema"
  base.set_layout(c, arg.layout)
  return c
