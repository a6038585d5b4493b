"""Control for the red-team suite of #22: each attack against plain pytest, without the grader.

An attack that the grader scores 0 proves something only if it would have worked without the
grader. This runs every attack of tests/codetasks/sandbox/redteam/integrity_attacks.py (and the
runner-tampering attacks of redteam_tampering_test.py) on the mini project with `python -m
pytest` in a temporary directory — no sandbox, no rewriting, no guard — and prints whether the
hidden test then passes (the attack's trick works) or not.

  python -m experiments.bench.redteam_controls [NAME ...]
"""

import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from tests.codetasks.mini_project import MINI, write_project
from tests.codetasks.sandbox.redteam.integrity_attacks import ATTACKS
from tests.codetasks.sandbox.redteam.redteam_tampering_test import LAYERED


def project_with(shape: str, prelude: str, body: str) -> tuple[dict, list[str]]:
  """The mini project without the deleted feature, plus the attack; the hidden test ids."""
  files = {k: textwrap.dedent(v) for k, v in MINI.items() if k.endswith((".py", ".cfg"))}
  files = {k: v for k, v in files.items() if "__pycache__" not in k}
  core = files["minipkg/core.py"]
  if shape == "greet":
    start, end = core.index("  def greet(self):"), core.index("  def farewell_message")
    code = prelude + "\n\ndef _greet(self):\n" + textwrap.indent(body, "  ")
    code += "\nGreeter.greet = _greet\n"
    f2p = ["tests/test_core.py::TestGreeter::test_greet"]
  else:
    start, end = core.index("def hypot_scaled"), core.index("class Greeter")
    code = prelude + "\n\ndef hypot_scaled(a, b):\n" + textwrap.indent(body, "  ") + "\n"
    f2p = ["tests/test_core.py::test_hypot"]
  files["minipkg/core.py"] = core[:start] + core[end:] + "\n" + code
  return files, f2p


def control(shape: str, prelude: str, body: str) -> str:
  files, f2p = project_with(shape, prelude, body)
  with tempfile.TemporaryDirectory(prefix="cj-controls-") as tmp:
    root = write_project(Path(tmp), files)
    args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist", *f2p]
    res = subprocess.run(
      [sys.executable, "-m", "pytest", *args], cwd=root, capture_output=True, text=True, timeout=120
    )
  last = ([ln for ln in res.stdout.splitlines() if ln.strip()] or ["(no output)"])[-1]
  return f"{'WORKS' if res.returncode == 0 else 'fails'} (exit {res.returncode}: {last[:60]})"


def main(argv=None) -> int:
  attacks = {name: (shape, pre, body) for name, (_, shape, pre, body) in ATTACKS.items()}
  attacks |= {f"tampering_{n}": ("hypot", pre, "return 0.0") for n, pre in LAYERED.items()}
  names = (argv if argv is not None else sys.argv[1:]) or sorted(attacks)
  for name in names:
    print(f"{name:52s} {control(*attacks[name])}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
