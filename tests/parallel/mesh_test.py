"""Tests for composer_jax.parallel.mesh: two views of one flat device order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from composer_jax.parallel.mesh import DENSE_AXES, EXPERT_AXES, default_mesh_config, make_meshes
from experiments.configs import layouts

# Expected (dense, expert) view shapes on 8 devices, written out by hand.
_SHAPES = {
  "fsdp": ((1, 8, 1, 1), (1, 8)),
  "hsdp": ((2, 4, 1, 1), (1, 8)),
  "fsdp_ep": ((1, 8, 1, 1), (1, 8)),
  "fsdp_tp": ((1, 4, 1, 2), (1, 8)),
  "cp2_ep8": ((1, 4, 2, 1), (1, 8)),
}


@pytest.mark.parametrize("name", sorted(_SHAPES))
def test_layout_views_share_flat_device_order(name):
  dm = make_meshes(layouts.get_config(name).mesh)
  assert dm.dense.axis_names == DENSE_AXES and dm.expert.axis_names == EXPERT_AXES
  assert (dm.dense.devices.shape, dm.expert.devices.shape) == _SHAPES[name]
  assert list(dm.dense.devices.flat) == jax.devices() == list(dm.expert.devices.flat)


def test_one_jit_takes_both_views_without_communication():
  dm = make_meshes(layouts.get_config("cp2_ep8").mesh)
  x = jnp.arange(32.0).reshape(8, 4)
  # Row d lives on flat device d in both views: (fsdp, context) is row-major, like `expert`.
  xd = jax.device_put(x, NamedSharding(dm.dense, P(("fsdp", "context"))))
  xe = jax.device_put(2 * x, NamedSharding(dm.expert, P("expert")))
  for i, shard in enumerate(xd.addressable_shards):
    assert shard.device == jax.devices()[i] == xe.addressable_shards[i].device
  f = jax.jit(lambda a, b: a * b)
  np.testing.assert_array_equal(f(xd, xe), 2 * x * x)
  hlo = f.lower(xd, xe).compile().as_text()
  for op in ("all-to-all", "all-gather", "all-reduce", "collective-permute"):
    assert op not in hlo


def test_explicit_device_order_is_kept():
  devs = jax.devices()[::-1]
  dm = make_meshes(default_mesh_config(fsdp=4, replica=2), devices=devs)
  assert list(dm.dense.devices.flat) == devs == list(dm.expert.devices.flat)


@pytest.mark.parametrize(
  "sizes, match",
  [
    (dict(fsdp=3), "multiply to 3, not the device count 8"),
    (dict(fsdp=-1, replica=3), "does not divide the device count 8"),
    (dict(expert=4), "multiply to 4, not the device count 8"),
    (dict(fsdp=-1, replica=-1), "at most one -1"),
    (dict(fsdp=0, replica=8), "must be >= 1"),
  ],
)
def test_bad_sizes_raise(sizes, match):
  with pytest.raises(ValueError, match=match):
    make_meshes(default_mesh_config(**sizes))


def test_unknown_view_raises():
  with pytest.raises(ValueError, match="Unknown mesh view 'moe'"):
    make_meshes(default_mesh_config()).view("moe")
