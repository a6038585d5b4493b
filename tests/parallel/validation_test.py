"""Tests for composer_jax.parallel.validation: layout-level constraints."""

import pytest

from composer_jax.model.config import get_preset
from composer_jax.parallel.mesh import default_mesh_config
from composer_jax.parallel.validation import validate_layout
from experiments.configs import layouts


@pytest.mark.parametrize("name", sorted(layouts.LAYOUTS))
def test_every_layout_fits_tiny_on_8_devices(name):
  validate_layout(layouts.get_config(name).mesh, get_preset("tiny"), 8, seq_len=64)


@pytest.mark.parametrize("mesh, model, seq_len, match", [
    (dict(fsdp=4), {}, None, "multiply to 4, not the device count 8"),
    (dict(expert_replica=2, expert=4), dict(n_routed_experts=6, n_group=2), None,
     "n_routed_experts=6 is not divisible by expert parallelism 4"),
    (dict(fsdp=4, context=2), {}, 30, "seq_len=30 is not divisible by 2 \\* context "
                                      "parallelism = 4"),
    (dict(fsdp=2, tensor=4), dict(num_heads=6), None,
     "num_heads=6 is not divisible by tensor parallelism 4"),
    (dict(fsdp=2, tensor=4), dict(attention="gqa", num_heads=8, num_kv_heads=2), None,
     "num_kv_heads=2 is not divisible by tensor parallelism 4"),
])
def test_bad_layout_raises(mesh, model, seq_len, match):
  with pytest.raises(ValueError, match=match):
    validate_layout(default_mesh_config(**mesh), get_preset("tiny", **model), 8, seq_len=seq_len)
