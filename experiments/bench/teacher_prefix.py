"""Teacher cost vs prefix length: full recompute vs reuse of the student's prefix cache.

    python -m experiments.bench.teacher_prefix [--prefix_lens=256,1024,4096] [--iters=3]

One trajectory: a prefix of P tokens, then a flagged model turn of `turn` tokens distilled with a
`hint`-token hint (`rl.teacher.build_teacher_batch`). Per flagged turn, median wall time of
  * full:   the teacher forward over prefix + hint + turn (`reuse_prefix=False`),
  * reuse:  `teacher.extend_teacher` over 1 + hint + turn on the prefix cache,
  * prefill: `teacher.prefill_prefix` of the trajectory (once per trajectory, shared by all of
    its flagged turns; for `flagged` turns per trajectory its share is prefill / flagged).
The model is the default tiny config made wider (`--hidden`), float32, one jitted program per
shape (compile excluded). Last line: `full_growth=X reuse_growth=Y` (time at the longest prefix /
time at the shortest).
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from composer_jax.model import transformer  # noqa: E402
from composer_jax.model.config import ModelConfig  # noqa: E402
from composer_jax.rl import teacher  # noqa: E402
from composer_jax.rl.trajectory import Trajectory, Turn, pack_batch  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("prefix_lens", ["256", "1024", "4096"], "Prefix lengths P (tokens).")
flags.DEFINE_integer("hint", 16, "Hint tokens.")
flags.DEFINE_integer("turn", 48, "Tokens of the flagged model turn.")
flags.DEFINE_integer("hidden", 512, "Model width (intermediate = 4x).")
flags.DEFINE_integer("layers", 2, "Layers (1 dense + MoE).")
flags.DEFINE_integer("iters", 3, "Timed calls per measurement (after one warm-up); median.")


def _median_seconds(fn, *args, iters):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iters):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def _batches(cfg, prefix: int, hint: int, turn: int):
  rng = np.random.default_rng(0)
  ids = lambda n: rng.integers(1, cfg.vocab_size, n).tolist()
  traj = Trajectory.from_turns([Turn(ids(prefix)), Turn(ids(turn), [-1.0] * turn)], 1.0, 0)
  student = pack_batch([traj], buckets=[prefix + turn])
  target = [teacher.DistillTarget(0, 1, ids(hint))]
  kw = dict(turn_buckets=[turn])
  full = teacher.build_teacher_batch([traj], student, target, buckets=[prefix + hint + turn], **kw)
  reuse = teacher.build_teacher_batch(
    [traj], student, target, buckets=[1 + hint + turn], reuse_prefix=True, **kw
  )
  return student, full, reuse


def main(argv):
  del argv
  lens = [int(p) for p in FLAGS.prefix_lens]
  longest = max(lens) + 2 * (FLAGS.hint + FLAGS.turn) + 1
  cfg = ModelConfig(
    hidden_size=FLAGS.hidden,
    intermediate_size=4 * FLAGS.hidden,
    moe_intermediate_size=FLAGS.hidden,
    num_layers=FLAGS.layers,
    max_position_embeddings=longest,
  )
  variables = transformer.init(cfg, jax.random.key(0))
  full_fn = jax.jit(functools.partial(teacher.teacher_hidden, cfg))
  prefill_fn = jax.jit(
    functools.partial(teacher.prefill_prefix, cfg), static_argnames="extension_len"
  )
  extend_fn = jax.jit(functools.partial(teacher.extend_teacher, cfg))
  print(
    f"device={jax.devices()[0].platform} hidden={cfg.hidden_size} layers={cfg.num_layers} "
    f"hint={FLAGS.hint} turn={FLAGS.turn}; median of {FLAGS.iters}, ms per flagged turn"
  )
  rows = []
  for p in lens:
    student, full, reuse = _batches(cfg, p, FLAGS.hint, FLAGS.turn)
    t_full = _median_seconds(full_fn, variables, student, full, iters=FLAGS.iters)
    ext = reuse["tokens"].shape[1]
    prefill = functools.partial(prefill_fn, extension_len=ext)
    t_pre = _median_seconds(
      prefill, variables, student["tokens"], student["positions"], iters=FLAGS.iters
    )
    cache = prefill(variables, student["tokens"], student["positions"])
    t_ext = _median_seconds(extend_fn, variables, cache, reuse, iters=FLAGS.iters)
    rows.append((t_full, t_ext))
    print(
      f"prefix={p:5d}: full {t_full * 1e3:8.1f}  reuse {t_ext * 1e3:7.1f}  "
      f"(prefill once per trajectory {t_pre * 1e3:8.1f})  full/reuse={t_full / t_ext:.1f}"
    )
  print(f"full_growth={rows[-1][0] / rows[0][0]:.2f} reuse_growth={rows[-1][1] / rows[0][1]:.2f}")


if __name__ == "__main__":
  app.run(main)
