"""Test mapping: which tests execute which functions, classes, methods and modules.

One sandboxed pytest run with a coverage context per test (covplugin.py) gives, for every
executed line, the tests that executed it; libcst positions attribute lines to symbols. A
symbol's tests are the union over its body lines (definition lines run at import time, outside
any test context, and are excluded).
"""

import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path

import coverage
import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from composer_jax.codetasks import project
from composer_jax.codetasks.sandbox import bwrap, suite


@dataclasses.dataclass(frozen=True)
class Symbol:
  """A deletable unit. kind: 'function' | 'class' | 'method' | 'module'."""

  kind: str
  path: str
  qualname: str  # 'func', 'Cls', 'Cls.meth'; the dotted module name for kind 'module'
  lines: tuple[int, int]  # body line range, inclusive

  @property
  def key(self) -> str:
    return f"{self.path}::{self.qualname}"

  @property
  def name(self) -> str:
    return self.qualname.rsplit(".", 1)[-1]


def _body_range(node, pos) -> tuple[int, int]:
  body = node.body.body if isinstance(node.body, cst.IndentedBlock) else [node.body]
  return pos[body[0]].start.line, pos[node].end.line


def symbols_in_file(root: Path, rel: str) -> list[Symbol]:
  """Top-level functions/classes, their methods, and the module itself."""
  code = (Path(root) / rel).read_text(encoding="utf-8")
  wrapper = MetadataWrapper(cst.parse_module(code))
  pos = wrapper.resolve(PositionProvider)
  out = [Symbol("module", rel, project.module_name(rel), (1, max(1, code.count("\n") + 1)))]
  for stmt in wrapper.module.body:
    if isinstance(stmt, cst.FunctionDef):
      out.append(Symbol("function", rel, stmt.name.value, _body_range(stmt, pos)))
    elif isinstance(stmt, cst.ClassDef):
      out.append(Symbol("class", rel, stmt.name.value, _body_range(stmt, pos)))
      for sub in stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else ():
        if isinstance(sub, cst.FunctionDef):
          out.append(
            Symbol("method", rel, f"{stmt.name.value}.{sub.name.value}", _body_range(sub, pos))
          )
  return out


@dataclasses.dataclass
class TestMap:
  """tests_by_symbol: Symbol.key -> sorted test ids that executed it.

  covered: source file -> sorted line numbers that some test executed (bug injection mutates
  only these).
  """

  symbols: dict[str, Symbol]
  tests_by_symbol: dict[str, list[str]]
  covered: dict[str, list[int]] = dataclasses.field(default_factory=dict)

  def digest(self) -> str:
    blob = json.dumps(self.tests_by_symbol, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()

  def to_json(self) -> dict:
    syms = [[s.kind, s.path, s.qualname, list(s.lines)] for s in self.symbols.values()]
    return {"symbols": syms, "tests_by_symbol": self.tests_by_symbol, "covered": self.covered}

  @classmethod
  def from_json(cls, blob: dict) -> "TestMap":
    syms = [Symbol(k, p, q, tuple(lines)) for k, p, q, lines in blob["symbols"]]
    return cls({s.key: s for s in syms}, blob["tests_by_symbol"], blob["covered"])


def build(
  root: Path, *, files: list[str] | None = None, limits=bwrap.DEFAULT_LIMITS
) -> tuple[TestMap, suite.SuiteRun]:
  """Runs the suite once under per-test coverage contexts and maps tests <-> symbols.

  `files`: the project's source files (default: found in root; pass them when root also holds
  a dependency runtime, whose modules are not the project's).
  """
  root = Path(root).resolve()
  files = project.source_files(root) if files is None else files
  # Measure the whole tree (tests included): simpler than per-layout source roots, and lines
  # outside `files` are ignored below. The data file is written in the sandbox's /tmp and comes
  # back through the harness's channel.
  inside = "/tmp/cj-coverage"
  args = ["-p", "cj_covplugin", f"--cj-cov-data={inside}", f"--cj-cov-source={bwrap.WS}"]
  run = suite.run_suite(root, limits=limits, extra_args=tuple(args), blob=inside)
  by_line = {}
  with tempfile.TemporaryDirectory(prefix="cj-cov-") as tmp:
    if run.blob:
      (Path(tmp) / "data").write_bytes(run.blob)
      data = coverage.CoverageData(basename=str(Path(tmp) / "data"))
      data.read()
      for measured in data.measured_files():
        rel = Path(measured).relative_to(bwrap.WS).as_posix()
        by_line[rel] = data.contexts_by_lineno(measured)
  syms, tests_by_symbol, covered = {}, {}, {}
  for rel in files:
    file_lines = by_line.get(rel, {})
    covered[rel] = sorted(line for line, ctx in file_lines.items() if any(ctx))
    for sym in symbols_in_file(root, rel):
      lo, hi = sym.lines
      tests = set()
      for line, contexts in file_lines.items():
        if lo <= line <= hi:
          tests.update(c for c in contexts if c)
      syms[sym.key] = sym
      tests_by_symbol[sym.key] = sorted(tests)
  return TestMap(syms, tests_by_symbol, covered), run
