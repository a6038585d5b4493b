"""`context_mesh.shards`: how many parts the current rules split a logical axis into."""

import jax

from composer_jax.parallel import context_mesh
from composer_jax.parallel.mesh import default_mesh_config, make_meshes
from composer_jax.parallel.rules import default_rules


def test_shards_multiplies_the_mesh_axes_a_logical_axis_maps_to():
  assert context_mesh.shards("seq") == 1  # outside any mesh
  # 8 devices: replica 2 x fsdp 2 x context 2; rules: batch -> (replica, fsdp), seq -> context.
  dm = make_meshes(default_mesh_config(replica=2, fsdp=2, context=2), jax.devices())
  with context_mesh.use_mesh(dm, default_rules()):
    assert context_mesh.shards("batch") == 4
    assert context_mesh.shards("seq") == 2
    assert context_mesh.shards("act_embed") == 1  # mapped to no mesh axis
    assert context_mesh.shards("act_embed", view="expert") == 1
