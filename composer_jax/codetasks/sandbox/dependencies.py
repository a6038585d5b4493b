"""A project's pinned dependency runtime, laid into the tree a sandboxed test run sees.

The sandboxed runner imports only from the workspace, so the runtime that
`synthesis.sources.build_runtime` installed (read-only, cached by the hash of its pins) is
copied into each test run's tree under RUNTIME_DIR (a `testing` directory: a protected path,
like tests) with a root conftest.py whose first line puts it on sys.path. A task carries both
in its hidden files, which the grader restores before every grade; neither is ever in the
visible workspace, so the policy can neither read the dependencies as source nor edit them.
"""

import shutil
from pathlib import Path

from composer_jax.codetasks import project

RUNTIME_DIR = ".cj_runtime/testing"
_BOOTSTRAP = (
  "import os as _cj_os, sys as _cj_sys; _cj_sys.path.insert(0, _cj_os.path.join("
  f"_cj_os.path.dirname(_cj_os.path.abspath(__file__)), {RUNTIME_DIR!r})); del _cj_os, _cj_sys"
  "  # the pinned dependency runtime (composer_jax.codetasks.sandbox.dependencies)\n"
)


def runtime_files(runtime: Path | None) -> dict[str, Path]:
  """Relative path -> file of a dependency runtime (empty for None)."""
  if runtime is None:
    return {}
  site = runtime / "site"
  return {rel: site / rel for rel in project.walk(site, skip=frozenset())}


def install_runtime(runtime: Path | None, tree: Path, original: Path | None = None) -> None:
  """Lays the runtime into `tree` under RUNTIME_DIR and prepends the sys.path line to the root
  conftest.py (that of `original`, default `tree`, or a new one). No-op for None."""
  files = runtime_files(runtime)
  if not files:
    return
  tops = {rel.split("/")[0].removesuffix(".py") for rel in files}
  mine = {project.module_name(f).split(".")[0] for f in project.source_files(original or tree)}
  if tops & mine:
    raise ValueError(f"dependency module(s) {sorted(tops & mine)} shadow the project's own")
  for rel, src in files.items():
    dst = tree / RUNTIME_DIR / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
  conf = (original or tree) / "conftest.py"
  old = conf.read_text(encoding="utf-8") if conf.is_file() else ""
  (tree / "conftest.py").write_text(_BOOTSTRAP + old, encoding="utf-8")
