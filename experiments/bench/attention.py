"""Training attention: memory and time of each kernel vs the old dense path, L = 256..4096.

    python -m experiments.bench.attention

For each sequence length, `jax.value_and_grad` of `sum(attention(q, k, v) * c)` at MLA's
`small` head shapes (H=8, dk=96, dv=64; batch 1, two packed documents) is compiled for
`reference` (the old path: `[B, H, L, L]` float32 logits under a dense mask) and the new
default, `auto` (`model/attention.py`: on CPU `blocked` with `--block`, the reference when
L fits one block); prints XLA's temp bytes (`compiled.memory_analysis()`),
whether the compiled program holds any `[.., L, L]` buffer, and the median step time
over `--rounds` interleaved rounds. For L >= 1024 the new path must hold none
(asserted).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from composer_jax.model import attention
from experiments.bench import timing

_LENGTHS = flags.DEFINE_list("lengths", ["256", "1024", "2048", "4096"], "Sequence lengths.")
_BLOCK = flags.DEFINE_integer("block", 512, "Query/key block of the blocked kernel.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rounds (each kernel once per round).")
_HEADS, _DK, _DV = 8, 96, 64


def _program(impl: str, length: int, block: int):
  """(compiled value_and_grad, its args) of one kernel at sequence length `length`."""
  rng = np.random.default_rng(0)
  q, k = (
    jnp.asarray(rng.standard_normal((1, length, _HEADS, _DK), dtype=np.float32)) for _ in range(2)
  )
  v = jnp.asarray(rng.standard_normal((1, length, _HEADS, _DV), dtype=np.float32))
  segments = jnp.asarray(np.where(np.arange(length) < 2 * length // 3, 1, 2)[None])
  mask = attention.SegmentMask(segments)

  def loss(q, k, v):
    out = attention.dot_product_attention(q, k, v, mask, 0.1, impl=impl, block=block)
    return jnp.sum(out * jnp.cos(out))

  fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
  return fn.lower(q, k, v).compile(), (q, k, v)


def _has_square_buffer(compiled, length: int) -> bool:
  """Whether any array in the optimized HLO has two trailing dims of size `length`."""
  return re.search(rf"\[[0-9,]*{length},{length}\]", compiled.as_text()) is not None


def main(argv):
  del argv
  print(
    f"device: {jax.devices()[0].device_kind}; value_and_grad, batch 1, H={_HEADS}, "
    f"dk={_DK}, dv={_DV}, float32, blocked block={_BLOCK.value}"
  )
  for length in map(int, _LENGTHS.value):
    progs = {impl: _program(impl, length, _BLOCK.value) for impl in ("reference", "auto")}
    times = timing.interleaved(
      {impl: lambda c=c, a=a: c(*a) for impl, (c, a) in progs.items()},
      _ROUNDS.value,
      jax.block_until_ready,
    )
    square = {}
    for impl, (compiled, _) in progs.items():
      temp = compiled.memory_analysis().temp_size_in_bytes
      square[impl] = _has_square_buffer(compiled, length)
      name = attention.resolve_attention_impl(impl, length, _BLOCK.value)
      print(
        f"L={length:5d} {impl:9s} ({name:9s}): temp {temp / 2**20:9.1f} MiB, [..,L,L] buffer: "
        f"{'yes' if square[impl] else 'no ':3s}, step {1e3 * times[impl]:9.1f} ms"
      )
    print(f"L={length:5d} new / old step time = {times['auto'] / times['reference']:.2f}")
    if length >= 1024:
      assert not square["auto"], f"the new path holds an [.., L, L] buffer at L={length}"
  print("no_LxL_buffer_for_L_ge_1024=True")


if __name__ == "__main__":
  app.run(main)
