"""Benchmark: the bubblewrap sandbox vs the old unshare + chroot one, and grading throughput.

Measures, on a small synthetic task (one deleted function, 2 FAIL_TO_PASS + 2 PASS_TO_PASS):
  startup   seconds per `bwrap.run(["/bin/true"])` (new: unshare + quota tmpfs + bwrap +
            seccomp + prlimit; old: unshare + python launcher + chroot)
  grade     seconds per gold-patch grade (new: monitor, pytest harness, direct re-run; old:
            patch screen + one pytest run)
  throughput graded tasks per minute with N parallel worker processes (new), gold and empty
            patches alternating.
The old sandbox is the tree of the commit before launcher.py was deleted, extracted with
`git archive` into a temp dir and run in a subprocess with PYTHONPATH pointing at it; the new
one runs the same worker code from this tree. Old and new alternate in rounds (median over
rounds) so load from other processes hits both alike.

  python -m experiments.bench.sandbox [--rounds 5] [--workers 1,2] [--grades 8]
"""

import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

from composer_jax.codetasks import cli

REPO = Path(__file__).resolve().parents[2]
PKG = {
  "calc/__init__.py": "from .core import add, mul\n",
  "calc/core.py": "def add(a, b):\n  return a + b\n\n\ndef mul(a, b):\n  return a * b\n",
  "tests/test_core.py": (
    "from calc import core\n\n\ndef test_add():\n  assert core.add(2, 3) == 5\n\n\n"
    "def test_add_neg():\n  assert core.add(-2, -3) == -5\n\n\n"
    "def test_mul():\n  assert core.mul(2, 3) == 6\n\n\ndef test_mul_zero():\n"
    "  assert core.mul(0, 3) == 0\n"
  ),
  "setup.cfg": "[tool:pytest]\ntestpaths = tests\n",
}
F2P = ["tests/test_core.py::test_add", "tests/test_core.py::test_add_neg"]
P2P = ["tests/test_core.py::test_mul", "tests/test_core.py::test_mul_zero"]
# Runs in a subprocess against either tree (PYTHONPATH); prints one JSON line of timings.
WORKER = r"""
import json, sys, time, types
from pathlib import Path
try:
  from composer_jax.codetasks.sandbox import bwrap as sandbox
  from composer_jax.codetasks.sandbox import grader
except ImportError:  # a tree before composer_jax/codetasks
  from composer_jax.codetasks.sandbox import bwrap
  from composer_jax.codetasks.sandbox import grader
what, n, task_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t = types.SimpleNamespace(**json.loads(Path(task_file).read_text()))
old = hasattr(sandbox, "isolation_mode")
times = []
for _ in range(n):
  s = time.perf_counter()
  if what == "startup":
    if old:
      r = bwrap.run(["/bin/true"], cwd="/", rw=[])
    else:
      r = bwrap.run(["/bin/true"])
    assert r.returncode == 0, r
  else:
    g = grader.grade(t, t.gold_patch)
    assert g.reward == 1.0, g
  times.append(time.perf_counter() - s)
print(json.dumps(times))
"""


def make_task(tmp: Path) -> Path:
  """The task record (only the fields both graders read) as a JSON file."""
  from composer_jax.codetasks import project
  from composer_jax.codetasks.sandbox import scrub
  from composer_jax.codetasks.task import unified_diff

  orig, vis = tmp / "orig", tmp / "visible"
  for root in (orig, vis):
    for rel, text in PKG.items():
      (root / rel).parent.mkdir(parents=True, exist_ok=True)
      (root / rel).write_text(text)
  broken = PKG["calc/core.py"].replace("def add(a, b):\n  return a + b\n", "")
  (vis / "calc/core.py").write_text(broken)
  (vis / "calc/__init__.py").write_text("from .core import mul\n")
  head = PKG["tests/test_core.py"].index("def test_mul():")
  (vis / "tests/test_core.py").write_text(
    "from calc import core\n\n\n" + PKG["tests/test_core.py"][head:]
  )
  scrub.fresh_git(vis)
  gold = unified_diff(
    {"calc/core.py": broken, "calc/__init__.py": "from .core import mul\n"},
    {"calc/core.py": PKG["calc/core.py"], "calc/__init__.py": PKG["calc/__init__.py"]},
  )
  rec = {
    "id": "calc-bench",
    "workspace": project.pack(vis, project.walk(vis, skip=frozenset())),
    "hidden_files": project.pack(orig, ["tests/test_core.py", "setup.cfg"]),
    "gold_patch": gold,
    "FAIL_TO_PASS": F2P,
    "PASS_TO_PASS": P2P,
  }
  path = tmp / "task.json"
  path.write_text(json.dumps(rec))
  return path


def tree_at(ref: str, dest: Path) -> Path:
  """The composer_jax package as of commit `ref`, extracted into `dest` (git archive)."""
  dest.mkdir()
  archive = subprocess.run(
    ["git", "-C", str(REPO), "archive", ref, "composer_jax"], capture_output=True, check=True
  ).stdout
  subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
  return dest


def old_tree(tmp: Path) -> Path:
  """The composer_jax package as of the commit before launcher.py was deleted."""
  gone = subprocess.run(
    [
      "git",
      "-C",
      str(REPO),
      "rev-list",
      "-1",
      "HEAD",
      "--",
      "composer_jax/envs/coding/launcher.py",
    ],
    capture_output=True,
    text=True,
    check=True,
  ).stdout.strip()
  return tree_at(f"{gone}^", tmp / "old")


def worker(tree: Path, what: str, n: int, task: Path) -> list[float]:
  env = {**os.environ, "PYTHONPATH": str(tree)}
  out = subprocess.run(
    [sys.executable, "-c", WORKER, what, str(n), str(task)],
    env=env,
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  return json.loads(out.strip().splitlines()[-1])


def _grade_one(args) -> float:
  task_file, gold = args
  import types

  from composer_jax.codetasks.sandbox import grader

  t = types.SimpleNamespace(**json.loads(Path(task_file).read_text()))
  g = grader.grade(t, t.gold_patch if gold else "")
  assert g.reward == (1.0 if gold else 0.0), g
  return g.reward


def throughput(task: Path, workers: int, grades: int) -> float:
  """Graded tasks per minute with `workers` processes (gold and empty alternating)."""
  jobs = [(str(task), i % 2 == 0) for i in range(grades)]
  with concurrent.futures.ProcessPoolExecutor(workers) as pool:
    list(pool.map(_grade_one, jobs[:workers]))  # warm the workers (runtime pycache)
    s = time.perf_counter()
    list(pool.map(_grade_one, jobs))
  return 60 * grades / (time.perf_counter() - s)


def define_flags(fv: flags.FlagValues) -> None:
  flags.DEFINE_integer("rounds", 5, "alternations old/new", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("per_round", 3, "runs per worker call", lower_bound=1, flag_values=fv)
  flags.DEFINE_list("workers", ["1", "2"], "worker counts", flag_values=fv)
  flags.DEFINE_integer("grades", 8, "grades per throughput run", lower_bound=1, flag_values=fv)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = flags.FLAGS
  with tempfile.TemporaryDirectory(prefix="cj-bench-sbx-") as tmp:
    tmp = Path(tmp)
    task, old = make_task(tmp), old_tree(tmp)
    trees = {"new": REPO, "old": old}
    res = {f"{w}_{k}": [] for w in ("startup", "grade") for k in trees}
    for _ in range(args.rounds):
      for what in ("startup", "grade"):
        for name, tree in trees.items():
          times = worker(tree, what, args.per_round, task)
          res[f"{what}_{name}"].append(statistics.median(times[1:] or times))
    med = {k: statistics.median(v) for k, v in res.items()}
    out = {
      "startup_s": {"new": med["startup_new"], "old": med["startup_old"]},
      "startup_ratio_new_over_old": med["startup_new"] / med["startup_old"],
      "grade_s": {"new": med["grade_new"], "old": med["grade_old"]},
      "grade_ratio_new_over_old": med["grade_new"] / med["grade_old"],
      "rounds": args.rounds,
      "tasks_per_minute": {int(w): throughput(task, int(w), args.grades) for w in args.workers},
      "cpus": os.cpu_count(),
    }
  print(json.dumps(out, indent=1))


_parse_flags = cli.parse_flags(define_flags)  # app.run's parser (and tests/docs_commands_test)

if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
