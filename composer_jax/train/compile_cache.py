"""JAX's persistent compilation cache, and whole compiled programs kept beside it.

A second run of the same config (or a resumed one) loads its executables from disk instead
of recompiling them (the `tiny` train step: seconds of XLA compile time). Only the first
directory set in a process takes effect: JAX opens the cache once, at the first compile.
`Precompiled` skips tracing and lowering too: it saves the run's programs (init, train and
eval steps) as exported (lowered) programs in `<cache dir>/aot/`.
"""

import functools
import hashlib
import importlib.metadata
import os
import pickle

import jax
from absl import logging

OFF = "none"


def cache_dir(setting: str, workdir: str) -> str | None:
  """`train.compile_cache_dir` -> a directory: '' = `<workdir>/compile_cache`, 'none' = off."""
  if setting == OFF:
    return None
  return os.path.abspath(setting or os.path.join(workdir, "compile_cache"))


def enable(directory: str | None) -> None:
  """Caches every compiled program under `directory` (None: leaves the cache off)."""
  if directory is None:
    return
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  # Defaults skip programs compiled in under 1 s; the small step programs matter here too.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  logging.info("Persistent compilation cache: %s", directory)


@functools.cache
def _sources_digest() -> str:
  """The jax/jaxlib/flax/optax versions and every source file of `composer_jax`."""
  h = hashlib.sha256()
  for module in ("jax", "jaxlib", "flax", "optax"):
    h.update(f"{module}={importlib.metadata.version(module)};".encode())
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # composer_jax/
  for root, dirs, files in os.walk(package):
    dirs.sort()
    for name in sorted(f for f in files if f.endswith(".py")):
      path = os.path.join(root, name)
      h.update(os.path.relpath(path, package).encode())
      with open(path, "rb") as f:
        h.update(hashlib.sha256(f.read()).digest())
  return h.hexdigest()


# jax flags that change no traced program (cache locations, logging).
_VOLATILE_FLAGS = ("jax_compilation_cache", "jax_persistent_cache", "jax_log", "jax_explain")


def _library_fingerprint() -> str:
  """What a traced program depends on besides its arguments: versions, sources, flags, devices."""
  flags = sorted((k, v) for k, v in jax.config.values.items()
                 if isinstance(v, (bool, int, float, str, type(None)))
                 and not k.startswith(_VOLATILE_FLAGS))
  devices = [(d.platform, d.device_kind, d.id, d.process_index) for d in jax.devices()]
  return repr([_sources_digest(), flags, os.environ.get("XLA_FLAGS", ""), devices,
               jax.process_index(), jax.process_count()])


def _sharding(x):
  """`x`'s sharding if it is a committed array, else None (jit may place it anywhere)."""
  return x.sharding if getattr(x, "committed", False) else None


def _arg_spec(leaves, tree) -> str:
  """Tree structure, avals (shape, dtype, weak type) and shardings of flattened arguments."""
  return repr((str(tree), [(str(jax.api_util.shaped_abstractify(x)), str(_sharding(x)))
                           for x in leaves]))


def _abstract(x) -> jax.ShapeDtypeStruct:
  aval = jax.api_util.shaped_abstractify(x)
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=_sharding(x),
                              weak_type=aval.weak_type)


def _per_leaf(prefix, tree) -> list | None:
  """`jax.jit`'s `out_shardings` (None, or a pytree prefix of the outputs with None for
  unspecified) -> one entry per output leaf of `tree`, for the flattened exported call."""
  if prefix is None:
    return None
  prefix_leaves, prefix_tree = jax.tree.flatten(prefix, is_leaf=lambda x: x is None)
  subtrees = prefix_tree.flatten_up_to(jax.tree.unflatten(tree, range(tree.num_leaves)))
  return [s for s, sub in zip(prefix_leaves, subtrees, strict=True) for _ in jax.tree.leaves(sub)]


class Precompiled:
  """A jitted function whose traced and lowered program is kept beside the compilation cache.

  The persistent compilation cache skips XLA's compile but still traces and lowers the
  program in every process (seconds for the `tiny` train step); this saves the lowered
  program once (`jax.export`, flattened arguments) in `<cache dir>/aot/<name>-<key>` and
  later processes call it from there, so only its (cached) compile remains. The key hashes
  `settings` (everything of the run the program depends on), the arguments' tree, avals
  and shardings, the jax/jaxlib/flax/optax versions, every source file of `composer_jax`,
  jax's flags, XLA_FLAGS and the devices: a change to any of them exports a new one.
  `fn` is jitted with `donate_argnums` and `out_shardings` (as `jax.jit`'s); the loaded
  program returns the same `out_shardings` objects, so its outputs fed back in (a train
  step's state) have the argument spec of the first call and reuse its program (without
  them each output would come back with an equivalent sharding of another spelling, e.g.
  `P()` for `P(None, None)`, and the second call would export and compile it again).
  `directory`: the cache directory; None = jax's `jax_compilation_cache_dir` at call time
  (set by `enable`); without one, in a multi-process run, and with several devices and an
  uncommitted argument, it is the jitted function. Other attributes (`lower`, ...) are the
  jitted function's. Files are pickles: load only caches this code wrote.
  """

  def __init__(self, fn, name: str, settings: str, donate_argnums: tuple[int, ...] = (),
               out_shardings=None, directory: str | None = None):
    self._jitted = jax.jit(fn, donate_argnums=donate_argnums, out_shardings=out_shardings)
    self._name, self._settings, self._out_shardings = name, settings, out_shardings
    self._donate, self._directory = donate_argnums, directory
    self._loaded: dict[str, tuple] = {}  # arg spec -> (jitted flat call, output tree)

  def __getattr__(self, attr):
    return getattr(self._jitted, attr)

  def __call__(self, *args):
    directory = self._directory or jax.config.jax_compilation_cache_dir
    leaves, tree = jax.tree.flatten(args)
    # An exported program runs on the devices it was exported for; an uncommitted argument
    # (e.g. a fresh PRNG key) names none, so with several devices the jitted function places
    # it. Multi-process runs (each process one share of global arrays) keep the jitted one too.
    if not directory or jax.process_count() > 1 or (
        jax.device_count() > 1 and not all(getattr(x, "committed", False) for x in leaves)):
      return self._jitted(*args)
    spec = _arg_spec(leaves, tree)
    if spec not in self._loaded:
      key = hashlib.sha256("\n".join([self._settings, spec, _library_fingerprint()]).encode())
      path = os.path.join(directory, "aot", f"{self._name}-{key.hexdigest()[:32]}")
      exported, out_tree = self._load_or_export(path, args, leaves, tree)
      offsets = [len(jax.tree.leaves(args[:i])) for i in range(len(args))]
      donated = tuple(offsets[i] + j for i in self._donate
                      for j in range(len(jax.tree.leaves(args[i]))))
      self._loaded[spec] = (jax.jit(exported.call, donate_argnums=donated,
                                    out_shardings=_per_leaf(self._out_shardings, out_tree)),
                            out_tree)
    call, out_tree = self._loaded[spec]
    return jax.tree.unflatten(out_tree, call(*leaves))

  def _load_or_export(self, path: str, args, leaves, tree):
    if os.path.exists(path):
      try:
        with open(path, "rb") as f:
          blob, out_tree = pickle.load(f)
        return jax.export.deserialize(blob), out_tree
      except Exception as e:  # noqa: BLE001 -- an entry that does not load is exported again
        logging.warning("Saved program %s at %s does not load (%s); tracing it again",
                        self._name, path, e)
    out_trees = []

    def flat(*flat_args):
      out_leaves, out_tree = jax.tree.flatten(self._jitted(*jax.tree.unflatten(tree, flat_args)))
      out_trees.append(out_tree)
      return out_leaves

    exported = jax.export.export(jax.jit(flat))(*map(_abstract, leaves))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
      pickle.dump((exported.serialize(), out_trees[0]), f)
    os.replace(tmp, path)  # atomic: a reader sees the whole file or none
    return exported, out_trees[0]
