"""The prepared GPU check: matmul peak, `small` train-step MFU, vs_hf, in one short run.

    python -m experiments.bench.gpu_check --out=DIR [--budget_s=360]

Stages, each in its own process (its own GPU memory, its own time limit), in this order
until `--budget_s` is spent:

1. `peak`: bfloat16 8192^2 matmul rate (jax, with torch beside it as a cross-check), the
   median of 30 products after warm-up. This measured peak is the MFU yardstick.
2. `train:<variant>`: the real train step of `experiments/configs/small.py`
   (`train.programs`: Muon + AdamW, bf16 compute with float32 params and optimizer state)
   at random tokens already on the device. `--steps` steps are dispatched back to back with
   no host sync (metrics stay on the device), then one wait; tokens/s and MFU = model FLOPs
   (`composer_jax.model.flops`, 6N + causal attention) / step time / peak, against the
   measured peak and against 989 TFLOP/s (H100/H200 SXM dense bf16). `VARIANTS` below says
   what each variant changes (attention kernel, MoE grouped matmul, batch, remat).
3. `vs_hf`: `experiments.bench.vs_hf --device=gpu` (each side in its own process).

Every stage prints `RESULT {json}` lines; the parent collects them into DIR/gpu_check.json
and prints a summary table last. CI runs the peak and `preset` stages on CPU at `tiny`
(`tests/experiments/bench/gpu_check_test.py`), so a lent GPU's minutes go to measuring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

from composer_jax.host import processes
from experiments.bench import versus

_OUT = flags.DEFINE_string("out", os.environ.get("OUT", "/tmp/gpu_check"), "Output folder.")
_BUDGET = flags.DEFINE_integer("budget_s", 360, "Wall seconds for all stages together.")
_STAGE = flags.DEFINE_string("stage", "", "Internal: run one stage in this process.")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed train steps per variant.")
_PEAK = flags.DEFINE_float("peak_tflops", 0.0, "Internal: the measured peak for MFU.")
_VARIANTS = flags.DEFINE_list("variants", None, "Train variants to run (default: all, in order).")
_PRESET = flags.DEFINE_string("preset", "small", "Model preset of the train stage (tests: tiny).")
_SEQ = flags.DEFINE_integer("seq_len", 0, "Train seq_len (0 = the config's 2048; tests: less).")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 8192, "Side of the peak stage's square matmul.")

DATASHEET_TFLOPS = 989.0

# name -> (train overrides, model overrides). Base: experiments/configs/small.py as is
# (64 x 2048 tokens per step in 4 micro-batches, `dots` remat, attention 'auto' = jax_nn,
# MoE 'auto' = ragged_dot).
VARIANTS = {
  "cudnn_b16": ({"batch_size": 16, "grad_accum": 1}, {"attention_impl": "cudnn"}),
  "preset": ({}, {}),
  "cudnn_b32_noremat": (
    {"batch_size": 32, "grad_accum": 1},
    {"attention_impl": "cudnn", "remat_policy": "none"},
  ),
  "cudnn_b16_capacity": (
    {"batch_size": 16, "grad_accum": 1},
    {"attention_impl": "cudnn", "moe_dispatch": "capacity"},
  ),
  "cudnn_b16_tiled512": (
    {"batch_size": 16, "grad_accum": 1},
    {"attention_impl": "cudnn", "moe_grouped_matmul": "tiled", "moe_tile_rows": 512},
  ),
}
# Per-stage wall limits (seconds); the parent also stops at the budget.
_LIMITS = {"peak": 60, "train": 150, "vs_hf": 240}


def _result(**kw) -> None:
  print("RESULT " + json.dumps(kw), flush=True)


def _peak() -> None:
  import jax
  import jax.numpy as jnp

  n = _MATMUL_N.value
  print(f"devices: {jax.devices()}", flush=True)
  a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in (0, 1))
  mm = jax.jit(jnp.matmul)
  s, _ = versus.timed(lambda: mm(a, b).block_until_ready(), 30)
  _result(
    stage="peak", framework="jax", tflops=2 * n**3 / s / 1e12, device=jax.devices()[0].device_kind
  )
  try:
    import torch

    x, y = (torch.randn(n, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    s, _ = versus.timed(lambda: (x @ y, torch.cuda.synchronize()), 30)
    _result(
      stage="peak",
      framework="torch",
      tflops=2 * n**3 / s / 1e12,
      device=torch.cuda.get_device_name(),
    )
  except Exception as e:  # noqa: BLE001 -- the cross-check is optional
    print(f"torch matmul cross-check failed: {e!r}", flush=True)


def _train(variant: str) -> None:
  import jax
  import numpy as np

  from composer_jax.model import config as model_config
  from composer_jax.model import flops
  from composer_jax.train import programs as programs_lib
  from experiments.configs import small

  train_over, model_over = VARIANTS[variant]
  config = small.get_config()
  config.model = model_config.as_config(model_config.get_preset(_PRESET.value, **model_over))
  config.train.update(train_over)
  if _SEQ.value:
    config.train.seq_len = _SEQ.value
  model_cfg = model_config.model_config(config.model)
  t = config.train
  progs = programs_lib.programs(config, model_cfg)
  rng = np.random.default_rng(0)
  g, b, length = t.grad_accum, t.batch_size // t.grad_accum, t.seq_len
  tokens = rng.integers(0, model_cfg.vocab_size, (g, b, length + 1)).astype(np.int32)
  batch = {
    "tokens": tokens[..., :-1],
    "targets": tokens[..., 1:],
    "segment_ids": np.ones((g, b, length), np.int32),
    "positions": np.broadcast_to(np.arange(length, dtype=np.int32), (g, b, length)),
    "loss_mask": np.ones((g, b, length), np.float32),
  }
  batch = {k: jax.device_put(v, progs.train_batch_sharding) for k, v in batch.items()}
  t0 = time.perf_counter()
  state = progs.init(jax.random.PRNGKey(0), None)
  state, metrics = progs.train_step(state, batch)
  loss0 = float(metrics["loss"])
  compile_s = time.perf_counter() - t0
  state, metrics = progs.train_step(state, batch)
  jax.block_until_ready(state)
  t0 = time.perf_counter()
  for _ in range(_STEPS.value):
    state, metrics = progs.train_step(state, batch)
  jax.block_until_ready(state)
  step_s = (time.perf_counter() - t0) / _STEPS.value
  tokens_per_step = t.batch_size * length
  model_flops = tokens_per_step * flops.train_flops_per_token(model_cfg, length)
  achieved = model_flops / step_s / 1e12
  mem = jax.devices()[0].memory_stats() or {}
  _result(
    stage="train",
    variant=variant,
    preset=_PRESET.value,
    batch=t.batch_size,
    seq=length,
    grad_accum=g,
    remat=model_cfg.remat_policy,
    attention=model_cfg.attention_impl,
    moe=f"{model_cfg.moe_dispatch}/{model_cfg.moe_grouped_matmul}",
    step_s=step_s,
    tokens_per_s=tokens_per_step / step_s,
    model_tflops=achieved,
    mfu_vs_measured=achieved / _PEAK.value if _PEAK.value else None,
    mfu_vs_989=achieved / DATASHEET_TFLOPS,
    compile_and_first_step_s=compile_s,
    loss_first=loss0,
    loss_last=float(metrics["loss"]),
    peak_gib=mem.get("peak_bytes_in_use", 0) / 2**30,
  )


def _run_stage(args: list[str], limit: float, log_path: str) -> list[dict]:
  """Runs `python -m <args>` with a time limit (killed at it; vs_hf's workers die with it,
  as every child started through `host.processes` does), appending its output to `log_path`;
  prints the output's tail and returns its RESULT records."""
  cmd = [sys.executable, "-m", *args]
  print(f"=== {' '.join(args)} (limit {limit:.0f} s)", flush=True)
  with open(log_path, "a") as log:
    log.write(f"=== {' '.join(cmd)}\n")
    log.flush()
    start = log.tell()
    proc = processes.popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
      code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
      code = f"timeout after {limit:.0f} s"
  with open(log_path) as log:
    log.seek(start)
    out = log.read().splitlines()
  results = [json.loads(ln[len("RESULT ") :]) for ln in out if ln.startswith("RESULT ")]
  print("\n".join([ln for ln in out if not ln.startswith("RESULT ")][-25:]), flush=True)
  if code != 0:
    print(f"[stage ended: {code}]", flush=True)
  return results


def _summary(results: list[dict]) -> None:
  print("\n=== summary")
  for r in results:
    if r["stage"] == "peak":
      print(f"peak {r['framework']:5s} {r['tflops']:7.1f} TFLOP/s bf16 matmul ({r['device']})")
  for r in results:
    if r["stage"] == "train":
      mfu = f"{r['mfu_vs_measured']:.1%}" if r["mfu_vs_measured"] else "n/a"
      print(
        f"train {r['variant']:20s} {r['batch']}x{r['seq']}/{r['grad_accum']} "
        f"step {1e3 * r['step_s']:8.1f} ms {r['tokens_per_s']:9.0f} tok/s "
        f"{r['model_tflops']:6.1f} TFLOP/s MFU {mfu} (measured peak), "
        f"{r['mfu_vs_989']:.1%} (989); peak mem {r['peak_gib']:.1f} GiB; "
        f"loss {r['loss_first']:.3f}->{r['loss_last']:.3f}"
      )


def main(argv):
  del argv
  if _STAGE.value == "peak":
    return _peak()
  if _STAGE.value.startswith("train:"):
    return _train(_STAGE.value.split(":", 1)[1])
  os.makedirs(_OUT.value, exist_ok=True)
  deadline = time.perf_counter() + _BUDGET.value
  left = lambda: deadline - time.perf_counter()
  results = []
  log = os.path.join(_OUT.value, "gpu_check.log")
  open(log, "w").close()
  me = "experiments.bench.gpu_check"
  results += _run_stage(
    [me, "--stage=peak", f"--matmul_n={_MATMUL_N.value}"], min(_LIMITS["peak"], left()), log
  )
  peaks = [r["tflops"] for r in results if r["stage"] == "peak" and r["framework"] == "jax"]
  peak = peaks[0] if peaks else 0.0
  for variant in _VARIANTS.value or list(VARIANTS):
    if left() < 60:
      print(f"=== skipped train:{variant}: {left():.0f} s of the budget left", flush=True)
      continue
    results += _run_stage(
      [
        me,
        f"--stage=train:{variant}",
        f"--peak_tflops={peak}",
        f"--steps={_STEPS.value}",
        f"--preset={_PRESET.value}",
        f"--seq_len={_SEQ.value}",
      ],
      min(_LIMITS["train"], left()),
      log,
    )
  if left() > 90:
    _run_stage(
      [
        "experiments.bench.vs_hf",
        "--device=gpu",
        "--presets=tiny,small",
        "--tiny_batch=32",
        "--tiny_seq=512",
        "--small_layers=0",
        "--small_batch=8",
        "--small_seq=1024",
        "--rounds=5",
      ],
      min(_LIMITS["vs_hf"], left()),
      log,
    )
  else:
    print(f"=== skipped vs_hf: {left():.0f} s of the budget left", flush=True)
  with open(os.path.join(_OUT.value, "gpu_check.json"), "w") as f:
    json.dump(results, f, indent=1)
  _summary(results)


if __name__ == "__main__":
  app.run(main)
