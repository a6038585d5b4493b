"""RL steps/s: colocated vs disaggregated (sampler and trainer on disjoint devices).

    python -m experiments.bench.rl_modes [--steps=6] [--repeats=3] [--groups=8] \
        [--max_new_tokens=3] [--max_model_turns=4]

Runs on 8 fake CPU devices (XLA_FLAGS set below, before jax is imported). The trainer runs the
RL update of `rl_tool_feedback.py:rl` on devices 0-3 (layout fsdp, 4 devices). Colocated: the
sampler samples on the same 4 devices, then the trainer trains. Disaggregated, staleness 1:
the sampler samples batch k + 1 on devices 4-7 with the weights of step k while the trainer
trains on batch k. Overlapping pays where sampling (a host-driven episode loop, one decode
call per turn) dominates the step; on 2 shared CPU cores at --groups=8 the two take about as
long (README: measured ratio 0.89, median of 3). Each repeat runs both
modes (order alternating) as RL runs (`rl.run`, a fresh workdir each) of `--steps` timed steps
after 2 untimed ones (compilation); a step's time is the `seconds` its record holds (the RL
program's host time from the step's start to its update's dispatch: waits for the device
show in a later step's). Prints per mode the median steps/s, the median sampling seconds and
other seconds per step, the colocated sampling fraction (sampling / step seconds), and the
median over repeats of the ratio disaggregated / colocated (last line: `ratio=X`). Longer generations
(`--max_new_tokens`, `--max_model_turns`: the policy starts from a random init, so turns run to
`max_new_tokens`) and fewer episodes make sampling dominate. The 8 fake devices share this
machine's cores, so the two meshes also compete for the same CPUs.
"""

import os

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import tempfile  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from composer_jax.model import transformer  # noqa: E402
from composer_jax.model.config import model_config
from composer_jax.rl import run as rl_run  # noqa: E402
from experiments.configs import rl_tool_feedback  # noqa: E402
from experiments.tool_feedback import program  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 6, "Timed RL steps per mode and repeat (after 2 untimed ones).")
flags.DEFINE_integer("repeats", 3, "Repeats (the median is reported).")
flags.DEFINE_integer("groups", 8, "Tasks per step (x 4 episodes each).")
flags.DEFINE_integer("max_new_tokens", 3, "Tokens per sampled model turn at most.")
flags.DEFINE_integer("max_model_turns", 4, "Model turns per episode at most.")

_UNTIMED = 2


def _config(mode: str):
  c = rl_tool_feedback.get_config("rl,layout=fsdp")
  c.mesh.fsdp = 4
  c.train.steps = _UNTIMED + FLAGS.steps
  c.rl.update(
    dict(
      groups=FLAGS.groups,
      group_size=4,
      mode=mode,
      max_staleness=1 if mode == "disaggregated" else 0,
      sampler_devices=(4, 5, 6, 7) if mode == "disaggregated" else (),
    )
  )
  # Tasks of 1-3 calls, no probes; at the defaults the sizes first measured (README).
  # An episode: a first turn of at most 14 tokens, then per model turn the turn and a reply of
  # at most 4 tokens (padded to a multiple of 8).
  turns, new = FLAGS.max_model_turns, FLAGS.max_new_tokens
  pad8 = lambda n: -(-n // 8) * 8
  seq_len = pad8(14 + turns * (new + 4))
  c.env.update(dict(max_model_turns=turns, calls_per_task=0))
  c.rl.update(
    dict(
      seq_len=seq_len,
      prompt_len=pad8(14 + (turns - 1) * (new + 4)),
      teacher_seq_len=seq_len,
      max_new_tokens=new,
      probe_count=0,
    )
  )
  c.loss.log_term_grads = False
  return c


def _measure(mode: str, init) -> dict:
  config = _config(mode)
  config.train.update(
    dict(ckpt_every=config.train.steps, log_every=config.train.steps, compile_cache_dir="none")
  )
  with tempfile.TemporaryDirectory() as workdir:
    timed = rl_run.run(config, workdir, program.make_env(config), init)[_UNTIMED:]
  step_s = float(np.median([r["seconds"] for r in timed]))
  return dict(
    steps_per_s=len(timed) / sum(r["seconds"] for r in timed),
    sample_s=float(np.median([r["sampler/seconds"] for r in timed])),
    other_s=step_s - float(np.median([r["sampler/seconds"] for r in timed])),
    step_s=step_s,
  )


def main(argv):
  del argv
  init = jax.device_get(
    transformer.init(model_config(_config("colocated").model), jax.random.key(0))
  )
  results = {"colocated": [], "disaggregated": []}
  for i in range(FLAGS.repeats):
    order = ("colocated", "disaggregated") if i % 2 == 0 else ("disaggregated", "colocated")
    for mode in order:
      results[mode].append(_measure(mode, init))
      print(f"repeat {i} {mode}: {results[mode][-1]}", flush=True)
  for mode, runs in results.items():
    med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    print(
      f"{mode}: {med['steps_per_s']:.3f} steps/s (sampling {med['sample_s']:.2f} s, "
      f"the rest {med['other_s']:.2f} s per step; median of {len(runs)})"
    )
  fractions = [r["sample_s"] / r["step_s"] for r in results["colocated"]]
  print(
    f"colocated sampling fraction, median of {len(fractions)}: {float(np.median(fractions)):.2f}"
  )
  ratios = [
    d["steps_per_s"] / c["steps_per_s"]
    for c, d in zip(results["colocated"], results["disaggregated"], strict=True)
  ]
  print(
    f"disaggregated / colocated steps/s, median of {len(ratios)} repeats: "
    f"ratio={float(np.median(ratios)):.2f}"
  )


if __name__ == "__main__":
  app.run(main)
