"""`python -m experiments.coding.learn` as a tool: bad flags in one line, one live run per
--out, stage processes that die with the run (SIGTERM and kill -9), and the smoke size end to
end (every stage, summary.json with intervals, only OUT written, a re-run resumes)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composer_jax.train import workdir_lock
from experiments.coding import learn

ROOT = Path(__file__).resolve().parents[2]


def _learn(*flags, **kw):
  return subprocess.run(
    [sys.executable, "-m", "experiments.coding.learn", *flags],
    capture_output=True,
    text=True,
    cwd=ROOT,
    timeout=kw.pop("timeout", 120),
    **kw,
  )


@pytest.mark.parametrize(
  "flags, message",
  [
    (["--size=huge"], "--size=huge: value should be one of"),
    (["--heldout_fraction=0.1"], "--heldout_fraction=0.1"),
    (["--parallel=0"], "--parallel=0"),
    (["--publish=../x"], "--publish='../x': give a directory name"),
  ],
)
def test_bad_flags_are_one_line(flags, message, tmp_path):
  res = _learn(f"--out={tmp_path / 'o'}", *flags)
  assert res.returncode != 0 and message in res.stderr, res.stderr
  assert "Traceback" not in res.stderr and not (tmp_path / "o").exists()


def test_out_that_is_a_file_is_one_line(tmp_path):
  (tmp_path / "f").write_text("x")
  res = _learn(f"--out={tmp_path / 'f'}")
  assert res.returncode == 1 and res.stderr.strip().splitlines() == [
    f"error: --out={tmp_path / 'f'}: it is a regular file, not a directory; pass a directory "
    "(new, or this run's own)"
  ]


def test_a_live_run_on_the_same_out_is_refused(tmp_path):
  out = tmp_path / "o"
  lock = workdir_lock.acquire(str(out))  # a live run holds OUT
  try:
    res = _learn(f"--out={out}")
  finally:
    workdir_lock.release(lock)
  assert res.returncode == 1 and f"is in use by pid {os.getpid()}" in res.stderr, res.stderr
  assert "Traceback" not in res.stderr and not (out / "tasks").exists()


def _descendants(pid: int) -> set[int]:
  """The live processes below `pid` (from /proc: each one's parent)."""
  parents = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        stat = Path(f"/proc/{entry}/stat").read_text()
      except OSError:
        continue
      parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
  found, frontier = set(), {pid}
  while frontier:
    frontier = {p for p, parent in parents.items() if parent in frontier} - found
    found |= frontier
  return found


def _alive(pid: int) -> bool:
  try:
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
  except OSError:
    return False
  return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_run_stops_every_stage_process(sig, tmp_path):
  proc = subprocess.Popen(
    [sys.executable, "-m", "experiments.coding.learn", f"--out={tmp_path / 'o'}"],
    cwd=ROOT,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    deadline = time.monotonic() + 90
    children: set[int] = set()
    while not children and time.monotonic() < deadline:  # the tasks stage has started
      time.sleep(0.2)
      children = _descendants(proc.pid)
    assert children, "learn started no stage process within 90 s"
    time.sleep(1.0)  # let the stage start its own children
    children |= _descendants(proc.pid)
    os.kill(proc.pid, sig)
    proc.wait(timeout=30)
    # Within 3 s: sooner than a stage's next output line, which would kill it by SIGPIPE
    # once nobody reads its pipe (the death signal must do it, not the broken pipe).
    deadline = time.monotonic() + 3
    while any(map(_alive, children)) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not [p for p in children if _alive(p)], "stage processes outlived the run"
    if sig == signal.SIGTERM:
      assert proc.returncode == 128 + signal.SIGTERM
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def _tree(root: Path) -> set[str]:
  return {str(p.relative_to(root)) for p in (root / "experiments").rglob("*") if p.is_file()}


@pytest.mark.experiment
def test_smoke_runs_every_stage_writes_only_out_and_resumes(tmp_path):
  before = _tree(ROOT)
  out = tmp_path / "o"
  res = _learn("--size=smoke", f"--out={out}", timeout=900)
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  arms = ["warmup", *learn.ARMS]
  assert list(summary["arms"]) == arms and list(summary["vs_warmup"]) == arms
  held = len((out / "split" / "heldout.jsonl").read_text().splitlines())
  for arm in arms:
    row = summary["arms"][arm]
    assert set(row) == {"pass1", "ci95", "seeds", "tasks"}
    assert row["ci95"][0] <= row["pass1"] <= row["ci95"][1]
    assert row["seeds"] == learn.SIZES["smoke"].seeds and row["tasks"] == held
  assert summary["vs_warmup"]["warmup"]["ci95"] == [0.0, 0.0]
  k = learn.SIZES["smoke"].samples
  assert set(summary[f"pass{k}"]) == set(arms) and set(summary["behaviour"]) == set(arms)
  curve = summary["warmup"]["seed0"]["curve"]
  assert curve and {"val_sampled", "train_greedy", "heldout_sampled"} <= set(curve[0])
  for arm in learn.ARMS:  # per RL step: reward, timing, task ids drawn
    assert len(summary["rl"][arm]["reward"]) == learn.SIZES["smoke"].rl_steps
    drawn = [
      json.loads(x) for x in (out / "seed0" / arm / "episodes.jsonl").read_text().splitlines()
    ]
    assert len(drawn[0]["tasks"]) == learn.SIZES["smoke"].groups * learn.SIZES["smoke"].group_size
  assert (out / "coding_agent.png").stat().st_size > 0
  assert _tree(ROOT) == before  # nothing written into the source tree
  stages = (out / "stage_times.jsonl").read_text()
  again = _learn("--size=smoke", f"--out={out}", timeout=300)
  assert again.returncode == 0 and (out / "stage_times.jsonl").read_text() == stages
  assert json.loads((out / "summary.json").read_text())["arms"] == summary["arms"]
