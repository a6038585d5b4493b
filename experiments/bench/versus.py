"""Ours vs a peer framework: each side in its own process, a health check, interleaved rounds.

    result = versus.compare([Side("ours", "jax", "experiments.bench.vs_hf:ours_train", args),
                             Side("transformers", "torch", "...:peer_train", args)],
                            rounds=5, flops_per_call=..., items_per_call=...)
    versus.report(result, "throughput_ratio_vs_hf_tiny")

Each side runs in a worker process of its own (`python -m experiments.bench.versus SPEC`),
so the two frameworks never share a process, a thread pool or an allocator. A worker:

1. on CPU, limits itself to `threads` CPUs before importing its framework (the affinity
   mask, from which XLA and torch size their thread pools; torch also `set_num_threads`,
   `OMP_NUM_THREADS`/`MKL_NUM_THREADS`); both sides get the same first `threads` CPUs,
   and never run at the same time;
2. sets the host memory up as `experiments.run` does (`composer_jax.train.host_memory`):
   the C heap keeps freed memory, for both sides; our executables run on the calling
   thread. Without them XLA:CPU faulted its per-run temporary buffer in afresh at every
   step (a third of our `tiny` step); the peer's `small` step gains from the first too
   (RESULTS.md, 2026-12-06);
3. measures its framework's health: a large matmul's rate (2048^2 float32 on CPU, 8192^2
   bfloat16 on GPU) and a small op's cost (value-and-grad of `sum(x @ w)`, x [128, 64],
   w [64, 64]: dispatch and per-op overhead, not arithmetic);
4. builds its step (`factory(**args)` returns a no-argument call that runs one step and
   waits for it), runs it `warmup` times, then waits on stdin and runs one step per line.

The parent runs the rounds one side after the other (the idle side blocks on a pipe read),
alternating which side goes first, and takes medians. With `passes`, for models whose two
processes do not fit in memory together, only one side's process is alive at a time: each
pass starts each side in turn for `rounds` steps, alternating which goes first. Every step is timed by wall clock
and by the worker's CPU time (all its threads). On CPU the ranking clock is CPU time: on
this project's shared 2-core machines wall time mostly measures other people's jobs,
and a 1-thread side's CPU seconds are the work it did. On GPU it is wall time.

Why one thread by default on CPU: torch's OpenMP pool (libgomp) spin-waits at every
parallel region's barrier. With 2 threads on 2 cores that other jobs also use, a barrier
waits for a descheduled thread's next time slice: measured here at load ~20, transformers'
`tiny` train step took 10.2 s wall / 2.2 s CPU with 2 threads against 0.28 s / 0.09 s with
1 (`OMP_WAIT_POLICY=PASSIVE`: 0.70 s / 0.15 s). XLA's pool suffers the same, less.

Health: a side is unhealthy (and no ratio is printed, with the reason) when its matmul
rate is below `MIN_MATMUL_FRACTION` of the best side's, or its small op costs more than
`MAX_SMALL_OP_RATIO` times the other side's. MFU = model FLOPs per step (the caller's
count, `composer_jax.model.flops`) / step time / the best matmul rate measured by the
health check on the ranking clock (a machine yardstick that the peer's speed does not
change unless the peer's BLAS is the faster one).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from composer_jax.host import processes
from composer_jax.train import host_memory

MIN_MATMUL_FRACTION = 0.5
MAX_SMALL_OP_RATIO = 10.0


@dataclasses.dataclass(frozen=True)
class Side:
  """One side: its name, framework ('jax' | 'torch') and step factory 'module:function'."""

  name: str
  framework: str
  factory: str
  args: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Result:
  """Per side: `health` (matmul_flops, small_op_s, both clocks) and step `times`."""

  device: str
  clock: str  # 'cpu' or 'wall': the clock medians, ratios and MFU use
  threads: int
  health: dict[str, dict]
  times: dict[str, dict[str, list[float]]]  # side -> {'wall': [...], 'cpu': [...]}
  loads: list[float]
  flops_per_call: float | None
  items_per_call: float | None
  item: str
  passes: int = 0  # > 0: `compare` ran one worker at a time, in this many passes

  def median(self, side: str, clock: str | None = None) -> float:
    return float(np.median(self.times[side][clock or self.clock]))

  def peak(self) -> float:
    """The best large-matmul FLOP/s of any side, on the ranking clock."""
    return max(h[f"matmul_flops_{self.clock}"] for h in self.health.values())

  def unhealthy(self) -> list[str]:
    """Reasons a ratio would not be evidence (empty when every side is healthy)."""
    why, peak = [], self.peak()
    for name, h in self.health.items():
      rate = h[f"matmul_flops_{self.clock}"]
      if rate < MIN_MATMUL_FRACTION * peak:
        why.append(
          f"{name}: large matmul {rate / 1e9:.1f} GFLOP/s is below "
          f"{MIN_MATMUL_FRACTION:g} x the best side's {peak / 1e9:.1f}"
        )
      for other, g in self.health.items():
        small, ref = h[f"small_op_s_{self.clock}"], g[f"small_op_s_{self.clock}"]
        if other != name and small > MAX_SMALL_OP_RATIO * ref:
          why.append(
            f"{name}: small op {1e6 * small:.0f} us is over {MAX_SMALL_OP_RATIO:g} x "
            f"{other}'s {1e6 * ref:.0f} us"
          )
    return why


# ---------------------------------------------------------------------------- worker side


def _limit_threads(framework: str, threads: int, device: str) -> None:
  """Before the framework is imported: at most `threads` intra-op threads."""
  if device == "cpu":
    # Both frameworks size their pools from the affinity mask (XLA's too: it has no flag).
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
  if framework == "jax":
    if device == "cpu":
      os.environ["JAX_PLATFORMS"] = "cpu"
  else:
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)


def timed(call: Callable[[], Any], reps: int) -> tuple[float, float]:
  """(median wall s, median CPU s) of `call()` over `reps` calls after one untimed call."""
  call()
  wall, cpu = [], []
  for _ in range(reps):
    t, c = time.perf_counter(), time.process_time()
    call()
    wall.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
  return float(np.median(wall)), float(np.median(cpu))


def _probes(framework: str, device: str) -> dict[str, float]:
  """The health check's large-matmul rate and small-op cost, on both clocks."""
  n = 2048 if device == "cpu" else 8192
  if framework == "jax":
    import jax
    import jax.numpy as jnp

    dtype = jnp.float32 if device == "cpu" else jnp.bfloat16
    a, b = (jax.random.normal(jax.random.key(i), (n, n), dtype) for i in (0, 1))
    mm = jax.jit(jnp.matmul)
    big = lambda: mm(a, b).block_until_ready()
    x, w = jnp.ones((128, 64)), jnp.ones((64, 64))
    grad = jax.jit(jax.grad(lambda x, w: jnp.sum(x @ w), argnums=(0, 1)))
    small = lambda: jax.block_until_ready(grad(x, w))
  else:
    import torch

    dev = "cuda" if device == "gpu" else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    a, b = (torch.randn(n, n, dtype=dtype, device=dev) for _ in range(2))
    big = lambda: (a @ b, sync())
    x = torch.ones(128, 64, device=dev, requires_grad=True)
    w = torch.ones(64, 64, device=dev, requires_grad=True)
    small = lambda: ((x @ w).sum().backward(), sync())
  big_wall, big_cpu = timed(big, 10 if device == "cpu" else 50)
  small_wall, small_cpu = timed(small, 50)
  flops = 2 * n**3
  if framework == "jax":
    version = f"jax {jax.__version__}"
  else:
    import transformers

    version = f"torch {torch.__version__}, transformers {transformers.__version__}"
  return {
    "version": version,
    "matmul_flops_wall": flops / big_wall,
    "matmul_flops_cpu": flops / big_cpu,
    "small_op_s_wall": small_wall,
    "small_op_s_cpu": small_cpu,
  }


def _worker(spec: dict) -> None:
  out = os.fdopen(spec["fd"], "w", buffering=1)
  _limit_threads(spec["framework"], spec["threads"], spec["device"])
  host_memory.keep_freed_memory()  # as `experiments.run` does; the same for both sides
  if spec["framework"] == "jax":
    host_memory.run_on_calling_thread()  # as `experiments.run` does
  health = _probes(spec["framework"], spec["device"])
  module, fn = spec["factory"].split(":")
  call = getattr(importlib.import_module(module), fn)(**spec["args"])
  for _ in range(spec["warmup"]):
    call()
  out.write(json.dumps({"health": health}) + "\n")
  for line in sys.stdin:
    if line.strip() != "step":
      break
    t, c = time.perf_counter(), time.process_time()
    call()
    out.write(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c}) + "\n")


# ---------------------------------------------------------------------------- parent side


class _Worker:
  """A side's process; `read()` returns its next message, raising with its log if it died."""

  def __init__(self, side: Side, *, threads: int, device: str, warmup: int):
    self.side = side
    read_fd, write_fd = os.pipe()
    self._log = tempfile.TemporaryFile(mode="w+")
    spec = dict(
      framework=side.framework,
      factory=side.factory,
      args=side.args,
      threads=threads,
      device=device,
      warmup=warmup,
      fd=write_fd,
    )
    self._proc = processes.popen(  # dies with this process, a killed one too
      [sys.executable, "-m", "experiments.bench.versus", json.dumps(spec)],
      stdin=subprocess.PIPE,
      stdout=self._log,
      stderr=subprocess.STDOUT,
      text=True,
      pass_fds=(write_fd,),
    )
    os.close(write_fd)
    self._messages = os.fdopen(read_fd)

  def read(self) -> dict:
    line = self._messages.readline()
    if not line:
      self._proc.wait()
      self._log.seek(0)
      tail = self._log.read()[-3000:]
      raise RuntimeError(
        f"side {self.side.name!r} ({self.side.factory}) exited with "
        f"{self._proc.returncode}; its output ends:\n{tail}"
      )
    return json.loads(line)

  def step(self) -> dict:
    self._proc.stdin.write("step\n")
    self._proc.stdin.flush()
    return self.read()

  def close(self) -> None:
    if self._proc.poll() is None:
      self._proc.stdin.close()
      self._proc.wait()
    self._log.close()


def compare(
  sides: list[Side],
  *,
  rounds: int,
  warmup: int = 1,
  threads: int = 1,
  device: str = "cpu",
  flops_per_call: float | None = None,
  items_per_call: float | None = None,
  item: str = "tokens",
  passes: int = 0,
) -> Result:
  """Starts each side's worker (one after the other: set-up is not timed), then `rounds`
  interleaved rounds, the first side going first in even rounds and last in odd ones.

  `passes` > 0: no two workers are alive at once (for models whose two processes do not fit
  in memory together). In each pass every side's worker in turn starts, runs `rounds`
  steps and exits; the side that goes first alternates between passes. Health is each
  side's last pass's.
  """
  health = {}
  times = {s.name: {"wall": [], "cpu": []} for s in sides}
  loads = []

  def step(w):
    loads.append(os.getloadavg()[0])
    t = w.step()
    for clock in ("wall", "cpu"):
      times[w.side.name][clock].append(t[clock])

  def start(side):
    w = _Worker(side, threads=threads, device=device, warmup=warmup)
    health[side.name] = w.read()["health"]
    return w

  workers = []
  try:
    if passes:
      for p in range(passes):
        for side in sides if p % 2 == 0 else sides[::-1]:
          workers = [start(side)]
          for _ in range(rounds):
            step(workers[0])
          workers.pop().close()
    else:
      for side in sides:
        workers.append(start(side))
      for r in range(rounds):
        for w in workers if r % 2 == 0 else workers[::-1]:
          step(w)
  finally:
    for w in workers:
      w.close()
  return Result(
    device=device,
    clock="cpu" if device == "cpu" else "wall",
    threads=threads,
    health=health,
    times=times,
    loads=loads,
    flops_per_call=flops_per_call,
    items_per_call=items_per_call,
    item=item,
    passes=passes,
  )


def report(result: Result, ratio_name: str, ours: str = "ours") -> float | None:
  """Prints health, per-side times, items/s and MFU, then `ratio_name=X` (peer time / our
  time: > 1 means we are faster) or, when a side is unhealthy, why there is no ratio.
  Returns the ratio or None."""
  r = result
  print(
    f"  health ({r.device}, {r.threads} thread(s), clock={r.clock}; load average "
    f"{min(r.loads):.1f}-{max(r.loads):.1f} over {len(r.loads)} steps):"
  )
  for name, h in r.health.items():
    print(
      f"    {name:14s} large matmul {h['matmul_flops_wall'] / 1e9:8.1f} GFLOP/s wall "
      f"{h['matmul_flops_cpu'] / 1e9:8.1f} per CPU-s; small op {1e6 * h['small_op_s_wall']:7.0f}"
      f" us wall {1e6 * h['small_op_s_cpu']:7.0f} us CPU ({h.get('version', '?')})"
    )
  peak = r.peak()
  for name in r.times:
    wall, cpu = r.median(name, "wall"), r.median(name, "cpu")
    line = f"    {name:14s} step {1e3 * wall:9.1f} ms wall {1e3 * cpu:9.1f} ms CPU"
    if r.items_per_call:
      line += f", {r.items_per_call / r.median(name):9.0f} {r.item}/s ({r.clock})"
    if r.flops_per_call:
      line += f", MFU {r.flops_per_call / r.median(name) / peak:6.1%}"
    print(line)
  if r.flops_per_call:
    print(
      f"    (MFU: {r.flops_per_call:.3g} model FLOPs per step / step time / best measured "
      f"matmul {peak / 1e9:.1f} GFLOP/s, {r.clock} clock)"
    )
  why = r.unhealthy()
  if why:
    print(f"  no {ratio_name}: a side is unhealthy, a ratio would not be evidence:")
    for w in why:
      print(f"    {w}")
    return None
  peers = [n for n in r.times if n != ours]
  ratio = min(r.median(p) for p in peers) / r.median(ours)
  wall = min(r.median(p, "wall") for p in peers) / r.median(ours, "wall")
  n = len(r.times[ours][r.clock])
  how = f"{n} steps a side, {r.passes} passes one process at a time" if r.passes else f"{n} rounds"
  print(f"  {ratio_name}={ratio:.2f}  (median of {how}, {r.clock} clock; wall clock: {wall:.2f})")
  return ratio


if __name__ == "__main__":
  _worker(json.loads(sys.argv[1]))
