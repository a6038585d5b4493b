"""What a run says at its start and end: `start_line` (what will run) and `summary_lines` (a
one-screen summary of what ran, where its outputs are). Pure: `train.loop.drive` logs them for
every run (supervised and RL alike).
"""

from __future__ import annotations

import os
import statistics

from composer_jax.train.metrics import format_duration

# Record keys the summary reports as final and best: (key, label, higher is better).
_SCORES = (
  ("loss", "train loss", False),
  ("eval_loss", "validation loss", False),
  ("reward", "reward", True),
)


def _count(n: int) -> str:
  """`1234567` -> `1.23M`."""
  for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
    if n >= div:
      return f"{n / div:.2f}{unit}"
  return str(n)


def start_line(
  driver: str,
  run_config: dict,
  param_counts: tuple[int, int],
  devices: list,
  start_step: int,
  workdir: str,
) -> str:
  """One line: driver (and environment), model preset, parameter counts, layout, devices,
  the steps that will run and the workdir.

  Args:
    driver: 'supervised' (`train.loop.train`, also an RL run's warm-up) or 'rl'
      (`rl.run`).
    run_config: the run config as a dict (`config.to_dict()`).
    param_counts: (total, active) of `model.transformer.param_counts`.
    devices: the JAX devices the run's mesh uses.
    start_step: steps already done (a resumed run's checkpoint step).
  """
  env = run_config.get("env", {}).get("name")
  t = run_config["train"]
  if driver == "rl":
    r = run_config["rl"]
    what, batch = f"rl ({env})", f"{r['groups'] * r['group_size']} episodes/step"
  else:
    what, batch = driver, f"{t['batch_size']}x{t['seq_len']} tokens/step"
  total, active = param_counts
  kinds = sorted({d.platform for d in devices})
  resumed = f", resumed at {start_step}" if start_step else ""
  return (
    f"Run {what} | model {_model(run_config['model'])}: {_count(total)} params "
    f"({_count(active)} active) | layout {run_config.get('layout', '?')} on {len(devices)} "
    f"{'/'.join(kinds)} device{'s' * (len(devices) != 1)} | steps {start_step + 1}-"
    f"{t['steps']}{resumed}, {batch} | workdir {workdir}"
  )


def _model(m: dict) -> str:
  """The run config's `model` section (every field of `model.config.ModelConfig`) in a few
  words: depth, width, attention, experts."""
  return (
    f"{m['num_layers']} layers, hidden {m['hidden_size']}, {m['attention'].upper()}, "
    f"{m['n_routed_experts']} experts top-{m['num_experts_per_tok']}"
  )


def _rate(records: list[dict], run_config: dict) -> str | None:
  """Tokens/s (median of the train records') or episodes/s (RL: episodes over step seconds)."""
  rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
  if rates:
    return f"{statistics.median(rates):,.0f} tokens/s (median of {len(rates)} records)"
  seconds = [r["seconds"] for r in records if "seconds" in r]
  if seconds and run_config.get("method") == "rl" and sum(seconds) > 0:
    r = run_config["rl"]
    episodes = r["groups"] * r["group_size"] * len(seconds)
    return (
      f"{episodes / sum(seconds):,.2f} episodes/s ({episodes} episodes in {len(seconds)} steps)"
    )
  return None


def summary_lines(
  records: list[dict],
  run_config: dict,
  *,
  start_step: int,
  end_step: int,
  total_steps: int,
  wall_s: float,
  workdir: str,
  checkpoint: str | None,
) -> list[str]:
  """The end-of-run summary: steps, final and best of train loss / validation loss / reward
  (those the records hold; best with its step), throughput, wall time, and the paths of the
  last checkpoint, `metrics.jsonl` and the TensorBoard events.

  Args:
    records: this run's metric records (`drive`'s), in step order.
    start_step, end_step: steps done before and after this run (a preempted run ends early).
    checkpoint: the directory of the last checkpoint saved, or None.
  """
  stopped = "" if end_step >= total_steps else f", stopped early (of {total_steps})"
  lines = [f"Run summary: steps {start_step + 1}-{end_step} done{stopped}"]
  startup = next((r["startup_s"] for r in records if "startup_s" in r), None)
  wall = format_duration(wall_s)
  lines.append(
    f"  wall time        {wall}" + (f" (startup {format_duration(startup)})" if startup else "")
  )
  for key, label, higher in _SCORES:
    values = [(r[key], r["step"]) for r in records if key in r]
    if values:
      best = (max if higher else min)(values, key=lambda v: v[0])
      lines.append(
        f"  {label:<16} final {values[-1][0]:.4f} (step {values[-1][1]}), best {best[0]:.4f} "
        f"(step {best[1]})"
      )
  rate = _rate(records, run_config)
  if rate:
    lines.append(f"  throughput       {rate}")
  lines += [
    f"  checkpoint       {checkpoint or 'none saved'}",
    f"  metrics          {os.path.join(workdir, 'metrics.jsonl')} (python -m experiments.plot "
    f"{workdir} --out FILE.png)",
    f"  tensorboard      {os.path.join(workdir, 'tensorboard')} "
    f"(tensorboard --logdir {os.path.join(workdir, 'tensorboard')})",
  ]
  return lines
