"""Time to a run's first step, cold and warm compilation cache, in CPU seconds per process.

    python -m experiments.bench.first_step [--repeats=3] [--config=default]

Each repeat starts a fresh process for a 1-step run of the config (no eval) on an empty cache
directory (cold), then another on that same directory (warm); prints each run's CPU seconds
(the whole process: imports, tracing, compiling or loading from the cache, the step) and its
`startup_s` (wall seconds from the trainer's start to the first step's metrics), then the
medians. CPU seconds hold better than wall time on a shared machine.
"""

import json
import os
import resource
import subprocess
import sys
import tempfile

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("repeats", 3, "Cold + warm pairs.")
flags.DEFINE_string("config", "default", "A supervised config of experiments/configs/.")

# One run, in its own process: argv = config name, cache dir, workdir.
_RUN = """
import json, sys
from composer_jax.train import loop
name, cache, workdir = sys.argv[1:4]
config = __import__(f"experiments.configs.{name}", fromlist=["_"]).get_config()
config.optim.warmup_steps = 0
config.train.update(dict(steps=1, eval_every=0, eval_batches=1, compile_cache_dir=cache))
print(json.dumps({"startup_s": loop.train(config, workdir)[0]["startup_s"]}))
"""


def _run(cache: str, workdir: str) -> dict:
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  out = subprocess.run(
    [sys.executable, "-c", _RUN, FLAGS.config, cache, workdir],
    check=True,
    capture_output=True,
    text=True,
    cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
  )
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return {**json.loads(out.stdout.strip().splitlines()[-1]), "cpu_s": cpu}


def main(argv):
  del argv
  runs = {"cold": [], "warm": []}
  for i in range(FLAGS.repeats):
    with tempfile.TemporaryDirectory() as d:
      for kind in ("cold", "warm"):
        runs[kind].append(_run(os.path.join(d, "cache"), os.path.join(d, kind)))
        print(f"repeat {i} {kind}: {runs[kind][-1]}", flush=True)
  for kind, rs in runs.items():
    print(
      f"{kind}: CPU {np.median([r['cpu_s'] for r in rs]):.2f} s, startup "
      f"{np.median([r['startup_s'] for r in rs]):.2f} s (median of {len(rs)})"
    )


if __name__ == "__main__":
  app.run(main)
