"""Tests for composer_jax.parallel.rules: logical names -> NamedSharding per view, and the
shard_map specs derived from them."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from composer_jax.model import transformer
from composer_jax.model.config import get_preset
from composer_jax.parallel import expert_parallel
from composer_jax.parallel.mesh import default_mesh_config, make_meshes
from composer_jax.parallel.rules import activation_sharding, default_rules, param_shardings
from experiments.configs import layouts

# A slice of the model's parameter tree (`transformer.logical_axes`, tiny-model dims): logical
# names and shapes.
_AXES = {
  "embed": ("vocab", "embed"),
  "gate": ("layers", "embed", "mlp"),
  "q_b": ("layers", "q_lora", "heads", "head_dim"),
  "o": ("layers", "heads", "head_dim", "embed"),
  "norm": ("layers", "norm"),
  "experts_down": ("layers", "experts", "expert_mlp", "embed"),
}
_SHAPES = {
  "embed": (512, 64),
  "gate": (1, 64, 128),
  "q_b": (2, 32, 4, 24),
  "o": (2, 4, 16, 64),
  "norm": (2, 64),
  "experts_down": (2, 8, 32, 64),
}
_SHAPE_TREE = {k: jax.ShapeDtypeStruct(s, "float32") for k, s in _SHAPES.items()}

# Expected specs, by hand from the rule tables (size-1 mesh axes dropped).
_EXPECTED = {
  "fsdp_ep": {
    "embed": P(None, "fsdp"),
    "gate": P(None, "fsdp", None),
    "q_b": P(None, "fsdp", None, None),
    "o": P(None, None, None, "fsdp"),
    "norm": P(None, None),
    "experts_down": P(None, "expert", None, None),
  },
  "fsdp": {
    "embed": P(None, "fsdp"),
    "gate": P(None, "fsdp", None),
    "q_b": P(None, "fsdp", None, None),
    "o": P(None, None, None, "fsdp"),
    "norm": P(None, None),
    "experts_down": P(None, None, None, "expert"),
  },
  "cp2_ep8": {
    "embed": P(None, ("fsdp", "context")),
    "gate": P(None, ("fsdp", "context"), None),
    "q_b": P(None, ("fsdp", "context"), None, None),
    "o": P(None, None, None, ("fsdp", "context")),
    "norm": P(None, None),
    "experts_down": P(None, "expert", None, None),
  },
  "fsdp_tp": {
    "embed": P("tensor", "fsdp"),
    "gate": P(None, "fsdp", "tensor"),
    "q_b": P(None, "fsdp", "tensor", None),
    "o": P(None, "tensor", None, "fsdp"),
    "norm": P(None, None),
    "experts_down": P(None, "expert", None, None),
  },
}


@pytest.mark.parametrize("name", sorted(_EXPECTED))
def test_param_shardings_match_hand_specs(name):
  cfg = layouts.get_config(name)
  dm = make_meshes(cfg.mesh)
  got = param_shardings(_AXES, dm, cfg.rules, shapes=_SHAPE_TREE)
  for k, spec in _EXPECTED[name].items():
    assert got[k].spec == spec, (k, got[k].spec, spec)
    assert got[k].mesh is (dm.expert if k == "experts_down" else dm.dense), k


def test_shardings_place_arrays():
  cfg = layouts.get_config("cp2_ep8")
  shardings = param_shardings(_AXES, make_meshes(cfg.mesh), cfg.rules, shapes=_SHAPE_TREE)
  arrays = jax.jit(
    lambda: {k: jax.numpy.zeros(s) for k, s in _SHAPES.items()}, out_shardings=shardings
  )()
  assert arrays["experts_down"].addressable_shards[0].data.shape == (2, 1, 32, 64)
  assert arrays["gate"].addressable_shards[0].data.shape == (1, 8, 128)


def test_activation_sharding():
  cfg = layouts.get_config("cp2_ep8")
  dm = make_meshes(cfg.mesh)
  assert activation_sharding(("batch", "seq", "act_embed"), dm, cfg.rules).spec == P(
    "fsdp", "context", None
  )
  assert activation_sharding(("batch", "act_embed"), dm, cfg.rules, "expert").spec == P(
    "expert", None
  )


def test_missing_rule_raises():
  rules = default_rules()
  rules.dense = [r for r in rules.dense if r[0] != "q_lora"]
  with pytest.raises(ValueError, match=r"No sharding rule for logical axis 'q_lora' of \['q_b'\]"):
    param_shardings(_AXES, make_meshes(layouts.get_config("fsdp_ep").mesh), rules)


def test_indivisible_dim_raises():
  cfg = layouts.get_config("fsdp_ep")
  shapes = dict(_SHAPE_TREE, gate=jax.ShapeDtypeStruct((1, 60, 128), "float32"))
  with pytest.raises(
    ValueError,
    match=r"\['gate'\] dim 1 \('embed'\) of size 60 is not "
    r"divisible by mesh axes \('fsdp',\) of total size 8",
  ):
    param_shardings(_AXES, make_meshes(cfg.mesh), cfg.rules, shapes=shapes)


def test_rule_with_unknown_mesh_axis_raises():
  rules = default_rules()
  rules.expert = [("experts", "fsdp")] + list(rules.expert)
  with pytest.raises(ValueError, match="names mesh axis 'fsdp', not in this view"):
    param_shardings(_AXES, make_meshes(layouts.get_config("fsdp_ep").mesh), rules)


@pytest.fixture(scope="module")
def tiny_tree():
  cfg = get_preset("tiny")
  return (
    transformer.logical_axes(cfg),
    jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0))),
  )


@pytest.mark.parametrize("name", sorted(layouts.LAYOUTS))
def test_every_layout_shards_the_whole_tiny_model(tiny_tree, name):
  names, shapes = tiny_tree
  layout = layouts.get_config(name)
  dm = make_meshes(layout.mesh)
  got = param_shardings(names, dm, layout.rules, shapes=shapes)
  experts = got["params"]["moe_layers"]["moe"]["experts"]["gate"]
  assert experts.mesh is dm.expert
  assert got["params"]["moe_layers"]["moe"]["shared"]["gate"]["kernel"].mesh is dm.dense
  assert len(jax.tree.leaves(got)) == len(jax.tree.leaves(shapes))


def test_none_names_a_dim_that_is_never_sharded():
  cfg = layouts.get_config("cp2_ep8")
  assert activation_sharding((None, "batch", "seq"), make_meshes(cfg.mesh), cfg.rules).spec == P(
    None, "fsdp", "context"
  )


def test_a_tuple_names_a_flattened_dim():
  # [B*L] tokens of a [B, L] array: batch's axes (major), then seq's; an axis a dim already
  # used is not reused.
  cfg = layouts.get_config("cp2_ep8")
  dm = make_meshes(cfg.mesh)
  assert activation_sharding((("batch", "seq"), "act_embed"), dm, cfg.rules).spec == P(
    ("fsdp", "context"), None
  )
  assert activation_sharding(("seq", ("batch", "seq")), dm, cfg.rules).spec == P("context", "fsdp")


@pytest.mark.parametrize(
  "mesh, batch_rule, want_tokens",
  [
    (dict(), ("expert_replica", "expert"), P("expert", None)),  # fsdp_ep: EP 8
    (
      dict(expert_replica=2, expert=4),
      ("expert_replica", "expert"),
      P(("expert_replica", "expert"), None),
    ),
    (dict(expert_replica=2, expert=4), "expert", P("expert", None)),  # tokens over EP only
  ],
)
def test_expert_parallel_specs_follow_the_rules(mesh, batch_rule, want_tokens):
  # The shard_map specs of the dispatch, by hand from the rule tables.
  rules = default_rules()
  rules.expert = [("batch", batch_rule)] + [r for r in rules.expert if r[0] != "batch"]
  got = expert_parallel.specs(make_meshes(default_mesh_config(**mesh)).expert, rules.expert)
  assert got.tokens == want_tokens and got.rows == P(want_tokens[0])
  assert got.gate_up == got.down == P("expert", None, None) and got.ep_axis == "expert"
  assert got.token_axes == (
    (want_tokens[0],) if isinstance(want_tokens[0], str) else want_tokens[0]
  )
