"""Layering: no library module imports a higher layer, and no modules import each other in a cycle.

Imports are read with `ast` from the source (every `import` / `from ... import`, including
those inside functions), so the check needs no import of the code itself.
"""

import ast
import functools
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The layers, low to high (README "Layering"): a module may import its own package and the
# packages of LOWER layers only, never a package of its own layer or above. `parallel` is at
# the bottom because the model runs its shard_map layers (context-parallel attention,
# expert-parallel MoE) on it; the optimizer reads parameter shardings, the trainer joins them.
# `chat` (the Kimi chat format) needs only the tokenizer from `data`.
LAYERS = (
  ("host",),  # processes, files and environment checks, no JAX: under everything
  ("data", "parallel"),
  ("model", "chat"),
  ("optim", "hf"),
  ("train",),
  ("rl", "tools"),  # tools: the import/export CLIs read any checkpoint (train.load_checkpoint)
  ("envs",),
  ("experiments",),
)
RANK = {p: i for i, layer in enumerate(LAYERS) for p in layer}


@functools.cache
def _modules():
  """{dotted module name: path} of every composer_jax module."""
  out = {}
  for dirpath, _, files in os.walk(os.path.join(ROOT, "composer_jax")):
    for f in files:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
        out[rel.removesuffix(".__init__")] = os.path.join(dirpath, f)
  return out


def _imports(module: str, path: str) -> set[str]:
  """Absolute names of the modules `path` imports (relative imports resolved)."""
  names = set()
  package = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
      # `from pkg import mod` imports the module pkg.mod; `from mod import name` the module.
      subs = {f"{base}.{a.name}" for a in node.names}
      names.update(subs if subs <= set(_modules()) else {base} | subs)
  return names


def _layer(name: str) -> str | None:
  """'rl' for composer_jax.rl.*, 'experiments' for experiments.*, else None."""
  parts = name.split(".")
  if parts[0] == "experiments":
    return "experiments"
  return parts[1] if parts[0] == "composer_jax" and len(parts) > 1 else None


def _allowed(importer: str, imported: str) -> bool:
  """May a module of package `importer` import one of package `imported`?"""
  return imported == importer or RANK[imported] < RANK[importer]


def test_every_package_has_a_layer():
  packages = {_layer(m) for m in _modules()} - {None}
  assert packages <= set(RANK), sorted(packages - set(RANK))


def test_no_library_module_imports_its_layer_or_a_higher_one():
  bad = []
  for module, path in sorted(_modules().items()):
    layer = _layer(module)
    bad += [
      f"{module} imports {n}"
      for n in sorted(_imports(module, path))
      if layer and _layer(n) in RANK and not _allowed(layer, _layer(n))
    ]
  assert not bad, bad


def _env(name: str) -> str | None:
  """'coding' for composer_jax.envs.coding.*, else None."""
  parts = name.split(".")
  return parts[2] if parts[:2] == ["composer_jax", "envs"] and len(parts) > 2 else None


def test_no_environment_imports_another():
  # Environments are plug-ins of rl.env.Env side by side; what two of them share (the feedback
  # registry, the Env protocol) lives in rl/.
  bad = []
  for module, path in sorted(_modules().items()):
    env = _env(module)
    bad += [
      f"{module} imports {n}"
      for n in sorted(_imports(module, path))
      if env and _env(n) not in (None, env)
    ]
  assert not bad, bad


def test_modules_have_no_import_cycles():
  # Edges between composer_jax modules (`from composer_jax.rl import losses` names the module
  # composer_jax.rl.losses), then a depth-first search for a back edge.
  modules = _modules()
  graph = {
    m: sorted({n for n in _imports(m, p) if n in modules and n != m}) for m, p in modules.items()
  }
  state, cycles = {}, []

  def visit(node, stack):
    state[node] = "open"
    for nxt in graph[node]:
      if state.get(nxt) == "open":
        cycles.append(stack[stack.index(nxt) :] + [nxt])
      elif nxt not in state:
        visit(nxt, stack + [nxt])
    state[node] = "done"

  for node in sorted(graph):
    if node not in state:
      visit(node, [node])
  assert not cycles, cycles


def test_the_check_sees_a_violation(tmp_path):
  # The parser resolves relative imports: `from ..envs import tools` inside composer_jax/rl.
  path = tmp_path / "x.py"
  path.write_text("from ..envs import tools\nimport composer_jax.experiments_not\n")
  assert "composer_jax.envs.tools" in _imports("composer_jax.rl.x", str(path))
  assert not _allowed("rl", _layer("composer_jax.envs.tools"))
  # The rules the README states: parallel below model, model below optim, nothing imports
  # experiments, and siblings of one layer (optim, hf) do not import each other.
  assert _allowed("model", "parallel") and not _allowed("parallel", "model")
  assert _allowed("optim", "model") and not _allowed("parallel", "optim")
  assert not _allowed("optim", "hf") and not _allowed("envs", "experiments")
  # Environments side by side: coding may not import tools.
  path.write_text("from composer_jax.envs.tools import feedback\n")
  names = _imports("composer_jax.envs.coding.agent.env", str(path))
  assert _env("composer_jax.envs.tools.feedback") in {_env(n) for n in names} - {None}
  assert _env("composer_jax.envs.tools.feedback") != _env("composer_jax.envs.coding.agent.env")
