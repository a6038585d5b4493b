"""Every command line quoted in README.md and BUILD.md runs as written.

Commands that finish in under a minute run for real (`_RUN`). The others (training runs,
benchmarks, the test suite itself) are checked for what a typo would break: the module or
script exists and parses exactly the flags the docs give it (absl modules are imported in
a forked child and their flag parser applied, which also loads `--config` files; argparse
scripts get `--help`; shell scripts `bash -n`). Placeholders (DIR, FILE, ID) become temporary
paths.
"""

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DOCS = ("README.md", "BUILD.md")
# Finish in under a minute on 2 CPU cores: run for real (the README's default run takes 1-4 min).
_RUN = ("experiments.figures.optimizer_step_cost", "kimi_k2_continued.py", "read_metrics")
# Not ours to run: external tools, cluster submissions (templates with `...`).
_EXTERNAL = ("pip install", "tensorboard", "sbatch", "tpu_pod.sh")


def _commands(docs=DOCS) -> list[str]:
  """Command lines in ```bash blocks (continuations joined) and inline `python ...` spans."""
  out = []
  for doc in docs:
    with open(os.path.join(REPO, doc)) as f:
      text = f.read()
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
      for line in block.replace("\\\n", " ").splitlines():
        line = shlex.join(shlex.split(line, comments=True))
        if line:
          out.append(line)
    # Inline spans with arguments; a bare `python -m MODULE` in prose names a module.
    out += [
      c
      for c in re.findall(r"`((?:python|sbatch|SETUP=1) [^`]+)`", text)
      if not re.fullmatch(r"python -m [\w.]+", c)
    ]
  return sorted(set(out))


def _modules_named() -> list[str]:
  names = []
  for doc in DOCS:
    with open(os.path.join(REPO, doc)) as f:
      names += re.findall(r"`python -m ([\w.]+)`", f.read())
  return sorted(set(names))


def _fill(cmd: str, tmp) -> list[str]:
  """argv of `cmd` with placeholders made concrete (DIR -> a fresh directory, ...)."""
  args = shlex.split(cmd)
  env_prefix = [a for a in args if re.match(r"^[A-Z_]+=", a)]
  args = args[len(env_prefix) :]
  subs = {
    "DIR": str(tmp / "dir"),
    "FILE": str(tmp / "file"),
    "ID": "x",
    "N": "2",  # a count (--workers N)
    "/tmp/adamw": str(tmp / "adamw"),
    "/tmp/mp": str(tmp / "mp"),
    "tasks.jsonl": str(tmp / "tasks.jsonl"),
  }
  return [subs.get(a, re.sub(r"=(/tmp/\w+)$", f"={tmp}/w", a)) for a in args]


# Imports the heavy libraries once, then in a forked child per command imports the module
# and applies its flag parser (the module's own `_parse_flags` if it has one) to the argv.
_FLAG_CHECK = """
import importlib, json, os, sys
import jax, flax, optax, orbax.checkpoint, grain  # shared by the children
from absl import flags
failures = {}
for argv in json.loads(sys.argv[1]):
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:
    os.close(r)
    os.dup2(w, 2)
    sys.argv = [argv[2], *argv[3:]]  # config_flags reads overrides from sys.argv
    try:
      mod = importlib.import_module(argv[2])
      getattr(mod, "_parse_flags", flags.FLAGS)(sys.argv)
      os._exit(0)
    except SystemExit as e:
      sys.stderr.write(str(e.code))
      os._exit(0 if e.code in (0, None) else 1)
    except BaseException as e:
      sys.stderr.write(f"{type(e).__name__}: {e}")
      os._exit(1)
  os.close(w)
  err = os.read(r, 1 << 16).decode()
  if os.waitpid(pid, 0)[1] != 0:
    failures[" ".join(argv)] = err.strip()[-500:]
print(json.dumps(failures))
"""


def _source(argv) -> str | None:
  """The file a `python -m X ...` or `python X.py ...` command runs (None for pytest)."""
  if argv[1] == "-m":
    if argv[2] == "pytest":
      return None
    spec = importlib.util.find_spec(argv[2])
    assert spec is not None, f"no module {argv[2]}"
    return spec.origin
  return os.path.join(REPO, argv[1])


def _check_argparse(cmd, argv, env):
  """`--help` works; every documented flag exists and every required one is given."""
  p = subprocess.run(
    [sys.executable, *argv[1 : 3 if argv[1] == "-m" else 2], "--help"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert p.returncode == 0, (cmd, p.stderr)
  own = argv[3 if argv[1] == "-m" else 2 :]
  own = own[: own.index("--")] if "--" in own else own  # the rest goes to experiments.run
  given = {a.split("=")[0] for a in own if a.startswith("--")}
  assert given <= set(re.findall(r"--[\w-]+", p.stdout)), (cmd, p.stdout)
  usage = p.stdout.split("\n\n")[0]
  required = set(re.findall(r"--[\w-]+", re.sub(r"\[[^\]]*\]|\([^)]*\)", "", usage)))
  assert required <= given, (cmd, required - given)


def test_docs_quote_commands():
  assert all(importlib.util.find_spec(m) for m in _modules_named())
  cmds = _commands()
  assert any("experiments.run" in c for c in cmds) and any("import_hf" in c for c in cmds)
  assert "python -m experiments.figures.optimizer_step_cost --out DIR" in cmds


def test_readme_is_a_front_door_whose_commands_all_run():
  # README: at most 150 lines (what it is, how to install/run/test, the layout, where next;
  # measured numbers live in RESULTS.md). Its install and test commands are .ci/run's own lines,
  # which CI runs verbatim; every other README command is run or flag-checked below, none is
  # skipped as external.
  with open(os.path.join(REPO, "README.md")) as f:
    assert len(f.read().splitlines()) <= 150
  with open(os.path.join(REPO, ".ci", "run")) as f:
    ci = set(f.read().splitlines())
  cmds = _commands(("README.md",))
  assert "python -m experiments.run" in cmds
  for cmd in cmds:
    if any(k in cmd for k in _EXTERNAL) or cmd.startswith("python -m pytest"):
      assert cmd in ci, f"README command {cmd!r} is not a line of .ci/run"


def test_documented_commands_run(tmp_path):
  """Real runs, absl flag checks (one process, a fork per command), argparse `--help`."""
  for d in ("dir", "workdir/default"):
    os.makedirs(tmp_path / d)
  (tmp_path / "file").write_text("")
  (tmp_path / "workdir/default/metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
  os.symlink(os.path.join(REPO, "experiments"), tmp_path / "experiments")  # relative --config
  env = dict(
    os.environ,
    XLA_FLAGS="",
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
  )
  real, absl_checks = [], []
  for cmd in _commands():
    if any(k in cmd for k in _EXTERNAL):
      continue
    argv = _fill(cmd, tmp_path)
    source = _source(argv)
    if any(k in cmd for k in _RUN):
      real.append((cmd, argv))
    elif argv[:3] == ["python", "-m", "pytest"]:  # the suite itself: its options and paths
      paths = [a for a in argv[3:] if not a.startswith("-") and a not in ("2", "not slow")]
      assert all(os.path.exists(os.path.join(REPO, a)) for a in paths), cmd
      assert "-n" not in argv or importlib.util.find_spec("xdist"), cmd
    elif "argparse" in open(source).read():
      _check_argparse(cmd, argv, env)
    else:
      absl_checks.append(argv)
  assert real and absl_checks

  proc = subprocess.run(
    [sys.executable, "-c", _FLAG_CHECK, json.dumps(absl_checks)],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == {}

  for cmd, argv in real:  # from tmp_path: `read_metrics` reads ./workdir/default
    p = subprocess.run(
      [sys.executable, *argv[1:]],
      cwd=tmp_path,
      env=env,
      capture_output=True,
      text=True,
      timeout=120,
    )
    assert p.returncode == 0, (cmd, p.stderr[-2000:])
