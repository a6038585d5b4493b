"""One process of `tests/parallel/distributed_test.py::test_checkpoint_barriers_*`: joins a
2-process run (`distributed.initialize`), then a `Checkpointer` saves, and a second one on the
same directory restores, an array sharded over all 8 devices; prints the restored sum.

    python -m tests.parallel.checkpoint_process COORDINATOR PROCESS_ID WORKDIR
"""

import sys

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from composer_jax.model.config import ModelConfig
from composer_jax.parallel import distributed
from composer_jax.train import checkpointing


def main(coordinator: str, process_id: str, workdir: str) -> None:
  distributed.initialize(
    distributed.Settings(coordinator=coordinator, num_processes=2, process_id=int(process_id))
  )
  sharding = NamedSharding(jax.make_mesh((8,), ("d",)), PartitionSpec("d"))
  x = jax.make_array_from_callback((16,), sharding, lambda i: np.arange(16.0, dtype=np.float32)[i])
  ckpt = checkpointing.Checkpointer(workdir, keep=1)
  ckpt.save(1, {"x": x}, {"position": 1}, ModelConfig(), {})
  ckpt.close()
  ckpt = checkpointing.Checkpointer(workdir, keep=1)
  abstract = {"x": jax.ShapeDtypeStruct((16,), np.float32, sharding=sharding)}
  restored = ckpt.restore(1, abstract)["x"]
  ckpt.close()
  print("restored sum", float(jax.jit(jax.numpy.sum)(restored)), flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
