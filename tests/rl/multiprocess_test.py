"""2 processes x 4 devices == 1 process x 8 devices for the RL update and for a whole RL run
(JAX multi-controller on CPU: `jax.distributed` with a local coordinator, cross-process
collectives over gloo)."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from composer_jax.model import transformer
from composer_jax.model.config import model_config
from tests import local_launch
from tests.rl import layouts_test, multiprocess_update

LAYOUT = "fsdp_ep"


@pytest.mark.slow  # ~40 s on 2 cores: two processes compile the sharded update, and this one
def test_two_processes_match_one(tmp_path):
  # One init for both sides.
  model_cfg = model_config(layouts_test._config("single").model)
  init = jax.device_get(
    jax.jit(transformer.init, static_argnums=0)
    .lower(model_cfg, jax.random.key(0))
    .compile()(jax.random.key(0))
  )
  init_path, out = str(tmp_path / "init.npz"), str(tmp_path / "update.npz")
  multiprocess_update.save_init(init, init_path)
  procs = local_launch.start_module(
    "tests.rl.multiprocess_update",
    2,
    4,
    lambda coordinator, i: (LAYOUT, coordinator, 2, i, init_path, out),
  )
  want_metrics, want_params, _, _ = layouts_test._update(LAYOUT, init)
  for p in procs:
    log, _ = p.communicate(timeout=900)
    assert p.returncode == 0, log[-5000:]
  got = np.load(out)
  assert want_metrics["num_distilled_tokens"] > 0
  for k, v in want_metrics.items():
    np.testing.assert_allclose(got[f"metrics/{k}"], v, rtol=1e-5, atol=1e-6, err_msg=k)
  for path, x in jax.tree_util.tree_leaves_with_path(jax.device_get(want_params)):
    key = f"params{jax.tree_util.keystr(path)}"
    np.testing.assert_allclose(got[key], x, rtol=1e-5, atol=1e-5, err_msg=key)


# A whole run of `rl_tool_feedback.py:sd,layout=fsdp_ep` at tiny sizes: short tasks (1-3 calls in 4
# turns), 30 warm-up steps (enough for the policy to call tools, so turns get flagged and the
# SD term has a gradient), 2 RL steps of 8 episodes with 8 probes.
_RL_ARGS = [
  "--config=experiments/configs/rl_tool_feedback.py:sd,layout=fsdp_ep",
  *(
    f"--config.{k}={v}"
    for k, v in {
      "env.calls_per_task": 0,
      "env.max_model_turns": 4,
      "warmup.steps": 30,
      "warmup.batch_size": 16,
      "warmup.seq_len": 64,
      "warmup.log_every": 10,
      "warmup.optim.warmup_steps": 1,
      "warmup.optim.total_steps": 30,
      "train.steps": 2,
      "train.log_every": 1,
      "rl.groups": 2,
      "rl.group_size": 4,
      "rl.teacher_rows": 8,
      "rl.probe_count": 8,
      "rl.seq_len": 48,
      "rl.prompt_len": 48,
      "rl.teacher_seq_len": 64,
      "loss.log_term_grads": False,
    }.items()
  ),
]


@pytest.mark.slow  # ~3 min of CPU: the 1-process run, then the 2-process RL part
def test_rl_run_two_processes_match_one(tmp_path):
  """`python -m experiments.run` of the RL program (warm-up, sampler, probes, RL steps,
  checkpoints) under launch/local.py: 2 processes x 4 devices == 1 process x 8, every logged
  value of every step.

  The 2-process run restores the 1-process run's warm-up (`<workdir>/warmup`, as a rerun
  does) instead of recomputing it: the warm-up is the supervised trainer's program, which
  tests/parallel/distributed_test.py runs on 2 processes against 1 already; here it saves a
  compile and 30 steps in each of 2 processes, and tests restoring a 1-process checkpoint on
  2 processes. One run after the other: 3 processes at once on 2 cores cost more CPU time
  (busy-waiting collectives), and the other needs the warm-up first.
  """
  multi, single = str(tmp_path / "multi"), str(tmp_path / "single")
  local_launch.wait_ok([local_launch.launch(1, 8, [*_RL_ARGS, f"--workdir={single}"])], 1200)
  shutil.copytree(os.path.join(single, "warmup"), os.path.join(multi, "warmup"))
  (out,) = local_launch.wait_ok(
    [local_launch.launch(2, 4, [*_RL_ARGS, f"--workdir={multi}"])], 1200
  )
  # Each process read the warm-up's last checkpoint; none trained a warm-up step.
  assert "/30 [" not in out and out.count("Trained variables of") == 2, out[-5000:]

  def records(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2]  # written once, by process 0
    return [{k: v for k, v in r.items() if "seconds" not in k and k != "startup_s"} for r in rows]

  got, want = records(multi), records(single)
  assert any(r["flagged_turns"] > 0 and r["grad_norm"] > 0 for r in want)
  for g, w in zip(got, want, strict=True):
    assert set(g) == set(w)
    for k, v in w.items():
      # 2 RL steps from the same warm-up in float32 with each mesh's own reduction order:
      # grad_norm differs by 2.4e-6 relative (1.4e-7 absolute) at the first step.
      np.testing.assert_allclose(g[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_rl_run_bad_input_is_one_line_per_process(tmp_path):
  """A disaggregated sampler on devices the 2-process trainer's mesh (all 8) also uses."""
  proc = local_launch.launch(
    2,
    4,
    [
      "--config=experiments/configs/rl_tool_feedback.py:sd,layout=fsdp_ep",
      f"--workdir={tmp_path}",
      "--config.rl.mode=disaggregated",
      "--config.rl.sampler_devices=(0,1,2,3)",
    ],
  )
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 1, out
  errors = sorted(line for line in out.splitlines() if "error: " in line)
  want = (
    "error: rl.mode='disaggregated': sampler devices (0, 1, 2, 3) overlap the trainer's devices"
  )
  assert len(errors) == 2 and all(
    e.startswith(f"[process {i}] {want}") for i, e in enumerate(errors)
  ), out
  assert "(layout 'fsdp_ep') on [0, 1, 2, 3]" in errors[0] and "Traceback" not in out
