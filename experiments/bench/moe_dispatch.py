"""Times a jitted forward+backward step, dropless (ragged_dot) vs dense one-hot MoE dispatch.

    python -m experiments.bench.moe_dispatch --presets=tiny,small

The timed function is `jax.value_and_grad` of the training loss (forward, chunked
cross-entropy through the output head, plus the balance loss) w.r.t. all params, at
random tokens, on one device; both dispatches of a preset run in the same process.
Prints compile seconds, median step milliseconds and the dense/dropless ratio.

Sizes: `tiny` at batch 8 x seq 64 (preset as is). `small` at batch 1 x seq 64 with
`--small_layers=2` (one dense + one MoE layer) so a CPU step takes seconds; on an
accelerator pass `--small_layers=0 --small_batch=8 --small_seq=2048`. Note that on CPU
`jax.lax.ragged_dot` lowers to a masked dense matmul over all experts, so dropless
cannot beat dense there; the gap it opens is an accelerator (grouped-GEMM) effect.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from composer_jax.model import config as model_config
from composer_jax.model import loss as model_loss
from composer_jax.model import transformer

_PRESETS = flags.DEFINE_list("presets", ["tiny", "small"], "Model presets to time.")
_TINY_BATCH = flags.DEFINE_integer("tiny_batch", 8, "Batch size for tiny.")
_TINY_SEQ = flags.DEFINE_integer("tiny_seq", 64, "Sequence length for tiny.")
_SMALL_BATCH = flags.DEFINE_integer("small_batch", 1, "Batch size for non-tiny presets.")
_SMALL_SEQ = flags.DEFINE_integer("small_seq", 64, "Sequence length for non-tiny presets.")
_SMALL_LAYERS = flags.DEFINE_integer("small_layers", 2,
                                     "num_layers for non-tiny presets (0 = the preset's).")
_ITERS = flags.DEFINE_integer("iters", 3, "Timed steps per dispatch (after one warm-up).")


def _time_step(cfg: model_config.ModelConfig, batch: int, seq: int,
               iters: int) -> tuple[float, float]:
  """(compile + first-call seconds, median step seconds) of value_and_grad of the loss."""
  variables = transformer.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, cfg.vocab_size)
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  mask = jnp.ones(inputs.shape, jnp.float32)

  def loss(params):
    hidden, aux = transformer.forward(cfg, {"params": params, "router": variables["router"]},
                                      inputs)
    ce, _ = model_loss.chunked_cross_entropy(hidden, transformer.output_head(cfg, params),
                                             targets, mask, chunk_size=1024)
    return ce + aux["balance_loss"]

  step = jax.jit(jax.value_and_grad(loss))
  t0 = time.perf_counter()
  jax.block_until_ready(step(variables["params"]))
  first = time.perf_counter() - t0
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(step(variables["params"]))
    times.append(time.perf_counter() - t0)
  return first, float(np.median(times))


def main(argv):
  del argv
  print(f"device: {jax.devices()[0].device_kind}")
  for preset in _PRESETS.value:
    cfg = model_config.get_preset(preset)
    batch, seq = _TINY_BATCH.value, _TINY_SEQ.value
    if preset != "tiny":
      batch, seq = _SMALL_BATCH.value, _SMALL_SEQ.value
      if _SMALL_LAYERS.value:
        cfg = cfg.replace(num_layers=_SMALL_LAYERS.value,
                          first_k_dense_replace=min(cfg.first_k_dense_replace,
                                                    _SMALL_LAYERS.value - 1))
    step_s = {}
    for dispatch in ("dropless", "dense"):
      first, step_s[dispatch] = _time_step(cfg.replace(moe_dispatch=dispatch), batch, seq,
                                           _ITERS.value)
      print(f"{preset} (layers={cfg.num_layers}, batch={batch}, seq={seq}, dtype={cfg.dtype}) "
            f"{dispatch:8s}: compile+first {first:7.1f} s, step {1e3 * step_s[dispatch]:9.1f} ms")
    print(f"{preset}: dense / dropless step time = {step_s['dense'] / step_s['dropless']:.2f}")


if __name__ == "__main__":
  app.run(main)
