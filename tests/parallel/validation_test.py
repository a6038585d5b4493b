"""Tests for composer_jax.parallel.validation (layout-level constraints) and the trainer's use of it."""

import pytest

from composer_jax.model.config import get_preset
from composer_jax.parallel.mesh import default_mesh_config
from composer_jax.parallel.validation import validate_layout
from composer_jax.train import placement
from experiments.configs import layouts

# The sizes of the `tiny` preset that validate_layout checks (MLA: no separate kv heads).
TINY = dict(routed_experts=8, heads=4, kv_heads=None)


def test_tiny_sizes_are_the_presets():
  c = get_preset("tiny")
  assert (c.n_routed_experts, c.num_heads, c.attention) == (
    TINY["routed_experts"],
    TINY["heads"],
    "mla",
  )


@pytest.mark.parametrize("name", sorted(layouts.LAYOUTS))
def test_every_layout_fits_tiny_on_8_devices(name):
  validate_layout(layouts.get_config(name).mesh, 8, **TINY, seq_len=64)


@pytest.mark.parametrize(
  "mesh, model, seq_len, match",
  [
    (dict(fsdp=4), {}, None, "multiply to 4, not the device count 8"),
    (
      dict(expert_replica=2, expert=4),
      dict(routed_experts=6),
      None,
      "n_routed_experts=6 is not divisible by expert parallelism 4",
    ),
    (
      dict(fsdp=4, context=2),
      {},
      30,
      "seq_len=30 is not divisible by 2 \\* context parallelism = 4",
    ),
    (
      dict(fsdp=2, tensor=4),
      dict(heads=6),
      None,
      "num_heads=6 is not divisible by tensor parallelism 4",
    ),
    (
      dict(fsdp=2, tensor=4),
      dict(heads=8, kv_heads=2),
      None,
      "num_kv_heads=2 is not divisible by tensor parallelism 4",
    ),
  ],
)
def test_bad_layout_raises(mesh, model, seq_len, match):
  with pytest.raises(ValueError, match=match):
    validate_layout(default_mesh_config(**mesh), 8, **{**TINY, **model}, seq_len=seq_len)


@pytest.mark.parametrize(
  "layout, model, seq_len, match",
  [
    (
      "cp2_ep8",
      dict(n_routed_experts=6, n_group=2),
      64,
      "n_routed_experts=6 is not divisible by expert parallelism 8",
    ),
    (
      "fsdp_tp",
      dict(attention="gqa", num_heads=8, num_kv_heads=1),
      64,
      "num_kv_heads=1 is not divisible by tensor parallelism 2",
    ),
    ("cp2_ep8", {}, 30, "seq_len=30 is not divisible by 2 \\* context parallelism = 4"),
  ],
)
def test_the_trainer_validates_every_mesh_it_builds(layout, model, seq_len, match):
  # Concrete meshes (programs) and abstract ones (memory plans) both go through check_layout.
  mesh, cfg = layouts.get_config(layout).mesh, get_preset("tiny", **model)
  with pytest.raises(ValueError, match=match):
    placement.build_mesh(mesh, cfg, seq_len)
  with pytest.raises(ValueError, match=match):
    placement.abstract_mesh(mesh, 8, cfg, seq_len)
