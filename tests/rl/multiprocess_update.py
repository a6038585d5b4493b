"""One RL update of `tests/rl/layouts_test.py` in one process of a multi-process run.

    python -m tests.rl.multiprocess_update LAYOUT COORDINATOR NUM_PROCESSES PROCESS_ID INIT OUT

Every process reads the initial variables from INIT (npz, `save_init`: the reference's own,
and no init program to compile here), builds the same batch (as every process of an RL run
samples the same episodes) and places it on the global mesh (`rl.mesh.place_batch`); process 0 writes the metrics and the
new params, gathered to host, to OUT (npz). Run by `tests/rl/multiprocess_test.py`.
"""

import sys

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from composer_jax.model import transformer
from composer_jax.model.config import model_config
from composer_jax.parallel import distributed
from composer_jax.rl import mesh as rl_mesh
from composer_jax.rl.programs import update_program
from composer_jax.rl.state import initial_state
from tests.rl import layouts_test


def save_init(init: dict, path: str) -> None:
  """`init` (`transformer.init`'s tree) to an npz, one array per leaf path."""
  np.savez(
    path, **{jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(init)}
  )


def load_init(model_cfg, path: str) -> dict:
  """The tree `save_init` wrote for `model_cfg`."""
  with np.load(path) as saved:
    return jax.tree_util.tree_map_with_path(
      lambda p, _: saved[jax.tree_util.keystr(p)], transformer.shapes(model_cfg)
    )


def main(layout, coordinator, num_processes, process_id, init_path, out):
  distributed.initialize(
    distributed.Settings(
      coordinator=coordinator, num_processes=int(num_processes), process_id=int(process_id)
    )
  )
  config = layouts_test._config(layout)
  model_cfg = model_config(config.model)
  init = load_init(model_cfg, init_path)
  prog = update_program(config, model_cfg)
  state = initial_state(config, model_cfg, init)
  batch, teacher = layouts_test._batches()
  shardings = jax.tree.map(lambda t: t.sharding, prog.progs.target.params)
  args = (
    state.params,
    state.opt_state,
    jax.device_put(init["router"], prog.replicated),
    rl_mesh.place_batch(batch, prog.per_token),
    (jax.device_put(init["params"], shardings),),
    rl_mesh.place_batch(teacher, prog.per_token, student_length=layouts_test.L),
  )
  compiled = prog.update.lower(*args).compile()
  params, _, metrics = compiled(*args)
  replicated = NamedSharding(prog.progs.mesh.dense, PartitionSpec())
  params, metrics = jax.jit(lambda x: x, out_shardings=replicated)((params, metrics))
  if jax.process_index() == 0:
    leaves = jax.tree_util.tree_leaves_with_path(params)
    np.savez(
      out,
      **{f"metrics/{k}": np.asarray(v.addressable_data(0)) for k, v in metrics.items()},
      **{f"params{jax.tree_util.keystr(p)}": np.asarray(x.addressable_data(0)) for p, x in leaves},
    )


if __name__ == "__main__":
  main(*sys.argv[1:])
