"""Worker pools for embarrassingly parallel jobs (task generation, grading).

One interface, `Pool.imap_unordered(fn, items) -> iterator of (item, result)`, two backends:
  local  a process pool on this machine (default; `workers=1` runs in-process, which keeps
         tracebacks readable and costs no process start-up);
  ray    Ray tasks on a cluster (`pip install 'composer_jax[ray]'`; `ray.init()` picks up
         RAY_ADDRESS, or starts a local instance).
`fn` must be a picklable top-level function and should not raise: jobs report failures in
their result, so one bad item never stops the others. A job whose worker died (killed, out of
memory) or that raised anyway yields the exception as its result.
"""

import concurrent.futures as cf
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator

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
    else:
      # fork would copy this process's threads (JAX, pip) into the children; spawn is clean.
      ctx = multiprocessing.get_context("spawn")
      with cf.ProcessPoolExecutor(self.workers, mp_context=ctx) as ex:
        futures = {ex.submit(fn, item): item for item in items}
        for fut in cf.as_completed(futures):
          yield futures[fut], fut.exception() or fut.result()

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


def _call(fn, item):
  """One Ray task (Ray wraps Python functions only; `fn` may be a builtin)."""
  return fn(item)
