"""The run's start line and end summary against hand-written records (LM and RL)."""

import jax

from composer_jax.train import summary
from experiments.configs import base, rl_tool_feedback

_LM = [
  {"step": 1, "loss": 5.0, "tokens_per_s": 100.0, "startup_s": 12.0},
  {"step": 2, "loss": 4.0, "tokens_per_s": 300.0},
  {"step": 3, "loss": 4.5, "tokens_per_s": 200.0, "eval_loss": 4.8},
  {"step": 4, "loss": 3.5, "tokens_per_s": 250.0, "eval_loss": 4.9},
]


def _lines(records, config, **kw):
  kw = {"start_step": 0, "end_step": 4, "total_steps": 4, "wall_s": 83.0, **kw}
  return summary.summary_lines(records, config, workdir="/w", checkpoint="/w/checkpoints/4", **kw)


def test_lm_summary_reports_final_best_rate_and_paths():
  lines = _lines(_LM, base.get_base_config().to_dict())
  text = "\n".join(lines)
  assert lines[0] == "Run summary: steps 1-4 done"
  assert "wall time        1m23s (startup 12s)" in text
  assert "train loss       final 3.5000 (step 4), best 3.5000 (step 4)" in text
  assert "validation loss  final 4.9000 (step 4), best 4.8000 (step 3)" in text
  assert "225 tokens/s (median of 4 records)" in text  # median of 100, 300, 200, 250
  assert "checkpoint       /w/checkpoints/4" in text
  assert "/w/metrics.jsonl" in text and "tensorboard --logdir /w/tensorboard" in text
  assert "reward" not in text and len(lines) <= 24  # one screen


def test_rl_summary_reports_reward_and_episodes_per_second():
  config = rl_tool_feedback.get_config().to_dict()
  episodes = config["rl"]["groups"] * config["rl"]["group_size"]
  records = [
    {"step": 1, "loss": 0.1, "reward": 0.25, "seconds": 2.0},
    {"step": 2, "loss": 0.2, "reward": 0.75, "seconds": 3.0},
    {"step": 3, "loss": 0.3, "reward": 0.5, "seconds": 5.0},
  ]
  text = "\n".join(_lines(records, config, end_step=3, total_steps=10))
  assert "steps 1-3 done, stopped early (of 10)" in text
  assert "reward           final 0.5000 (step 3), best 0.7500 (step 2)" in text
  assert f"{3 * episodes / 10.0:,.2f} episodes/s ({3 * episodes} episodes in 3 steps)" in text


def test_start_line_names_driver_model_layout_devices_and_steps():
  config = base.get_base_config()
  config.train.steps = 300
  line = summary.start_line(
    "supervised", config.to_dict(), (1_234_567, 890_000), jax.devices()[:2], 3, "/w"
  )
  assert line == (
    "Run supervised | model 3 layers, hidden 64, MLA, 8 experts top-2: 1.23M params (890.00k active) | layout single on 2 cpu "
    "devices | steps 4-300, resumed at 3, 16x128 tokens/step | workdir /w"
  ), line
  rl = rl_tool_feedback.get_config().to_dict()
  line = summary.start_line("rl", rl, (10, 10), jax.devices()[:1], 0, "/w")
  episodes = rl["rl"]["groups"] * rl["rl"]["group_size"]
  assert line.startswith(
    "Run rl (toolcall) | model 3 layers, hidden 64, MLA, 8 experts top-2: 10 params (10 active) | "
  )
  assert f"1 cpu device | steps 1-{rl['train']['steps']}, {episodes} episodes/step |" in line
