"""Worker pools for embarrassingly parallel jobs (task generation, grading).

One interface, `Pool.imap_unordered(fn, items) -> iterator of (item, result)`, two backends:
  local  a process pool on this machine (default; `workers=1` runs in-process, which keeps
         tracebacks readable and costs no process start-up);
  ray    Ray tasks on a cluster (`pip install 'composer_jax[ray]'`; `ray.init()` picks up
         RAY_ADDRESS, or starts a local instance).
`fn` must be a picklable top-level function and should not raise: jobs report failures in
their result, so one bad item never stops the others. A job whose worker died (killed, out of
memory) or that raised anyway yields the exception as its result. `map(fn, items)` returns the
results in order and raises the first failure instead (for callers that cannot go on without
every result, e.g. the steps of a batch of episodes).
Used as a context manager (`with Pool(...) as pool:`) a local pool keeps its worker processes
between calls, so many small batches (one per episode step) do not each pay process start-up.
Local workers die with the pool's process, `kill -9` included (`host.processes.die_with_parent`).
"""

import concurrent.futures as cf
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator

from composer_jax.host import processes

BACKENDS = ("local", "ray")


class Pool:
  """A pool of `workers` workers on `backend` (see the module docstring)."""

  def __init__(self, workers: int = 1, backend: str = "local"):
    if workers < 1:
      raise ValueError(f"workers={workers}: need at least 1")
    if backend not in BACKENDS:
      raise ValueError(f"unknown worker backend {backend!r}; valid: {list(BACKENDS)}")
    if backend == "ray":
      try:
        import ray  # noqa: F401  (optional extra)
      except ImportError:
        raise ValueError(
          "worker backend 'ray' needs ray: pip install 'composer_jax[ray]'"
        ) from None
    self.workers, self.backend = workers, backend
    self._executor = None

  def __enter__(self):
    if self.backend == "local" and self.workers > 1 and self._executor is None:
      self._executor = self._new_executor()
    return self

  def __exit__(self, *exc):
    if self._executor is not None:
      self._executor.shutdown(cancel_futures=True)
      self._executor = None

  def _new_executor(self):
    # fork would copy this process's threads (JAX, pip) into the children; spawn is clean.
    ctx = multiprocessing.get_context("spawn")
    return cf.ProcessPoolExecutor(
      self.workers, mp_context=ctx, initializer=processes.die_with_parent, initargs=(os.getpid(),)
    )

  def map(self, fn: Callable, items: Iterable) -> list:
    """[fn(item) for item in items], run on the pool; raises RuntimeError naming the first
    item whose job failed."""
    items = list(items)
    results = {}
    for (_, i, _), r in self.imap_unordered(_indexed, [(fn, i, x) for i, x in enumerate(items)]):
      results[i] = r
    for i in range(len(items)):
      if isinstance(results[i], BaseException):
        r = results[i]
        raise RuntimeError(f"job {i} of {len(items)} failed: {type(r).__name__}: {r}") from r
    return [results[i] for i in range(len(items))]

  def imap_unordered(self, fn: Callable, items: Iterable) -> Iterator[tuple]:
    """Yields (item, fn(item)) as jobs finish, at most `workers` at a time."""
    items = list(items)
    if self.backend == "ray":
      yield from self._ray(fn, items)
    elif self.workers == 1:
      for item in items:
        try:
          result = fn(item)
        except Exception as e:
          result = e
        yield item, result
    elif self._executor is not None:
      yield from _as_completed(self._executor, fn, items)
    else:
      with self._new_executor() as ex:
        yield from _as_completed(ex, fn, items)

  def _ray(self, fn, items):
    import ray

    if not ray.is_initialized():
      if os.environ.get("RAY_ADDRESS"):  # a running cluster brings its own resources
        ray.init(log_to_driver=False)
      else:
        ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(_call)
    pending = {remote.remote(fn, item): item for item in items}
    while pending:
      done, _ = ray.wait(list(pending), num_returns=1)
      for ref in done:
        item = pending.pop(ref)
        try:
          yield item, ray.get(ref)
        except Exception as e:  # RayTaskError, WorkerCrashedError
          yield item, e


def _as_completed(ex, fn, items):
  futures = {ex.submit(fn, item): item for item in items}
  for fut in cf.as_completed(futures):
    yield futures[fut], fut.exception() or fut.result()


def _indexed(job):
  """(fn, index, item) -> fn(item): the index tells `map` where the result goes."""
  fn, _, item = job
  return fn(item)


def _call(fn, item):
  """One Ray task (Ray wraps Python functions only; `fn` may be a builtin)."""
  return fn(item)
