"""Sharded Muon == single-device `scale_by_muon` on the tiny model; its shape groups and the
collectives of its compiled HLO against hand counts.

Every layout's sharded Muon also runs inside a full train step in
tests/train/layouts_test.py; here two layouts are compiled on their own (two steps, so
momentum and Nesterov terms count), between them covering: both matrix dims sharded
(fsdp x tensor), one dim sharded over two mesh axes (fsdp x context), two mesh views in one
update, batch-only groups (expert parallel, no communication) and padded groups.
"""

import math
import re

import chex
import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding

from composer_jax.model import axes as axes_lib
from composer_jax.model import transformer
from composer_jax.model.config import get_preset
from composer_jax.optim import muon
from composer_jax.optim.sharded_muon import muon_leaves, plan_groups, sharded_scale_by_muon
from composer_jax.parallel.mesh import make_meshes
from composer_jax.parallel.rules import param_shardings
from experiments.configs import layouts

# Hand count of shape groups whose matrix dims are sharded (2 all-to-alls each) for the
# tiny model. Dense view, [fan_in, fan_out] sharded over fsdp (fsdp x context in cp2_ep8):
# kv_a [64, 40]; kv_b [32, 32]; o [16, 64]; q_a + shared gate/up [64, 32]; q_b [32, 24];
# dense down [128, 64]; dense gate/up [64, 128]; shared down [32, 64] -> 8 groups, several
# padded (e.g. dense gate/up: 2 matrices over 8 devices). Expert view: none when experts
# are expert-parallel (whole matrices local); in `fsdp` the embed-sharded expert gate/up
# [64, 32] and down [32, 64] add 2. In `fsdp_tp`, shared gate/up (mlp on `tensor` too) no
# longer group with q_a -> 9; dense gate/up and down go through one all-to-all over
# fsdp x tensor each.
_SHARDED_GROUPS = {"fsdp": 10, "hsdp": 8, "fsdp_ep": 8, "cp2_ep8": 8, "fsdp_tp": 9}
_COMPILED = ("cp2_ep8", "fsdp_tp")

_COLLECTIVES = (
  "all-to-all",
  "all-gather",
  "all-reduce",
  "reduce-scatter",
  "collective-permute",
  "collective-broadcast",
  "ragged-all-to-all",
)
_OP = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = .*? ([a-z][a-z0-9\-]*)\(")  # the opcode
_CALLS = re.compile(
  r"\b(?:body|condition|to_apply|calls|branch_computations)="
  r"(\{[^}]*\}|%?[\w.\-]+)"
)


@pytest.fixture(scope="module")
def tiny():
  cfg = get_preset("tiny")
  names = transformer.logical_axes(cfg)["params"]
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))["params"]
  rng = np.random.default_rng(0)
  grads = [
    jax.tree.map(lambda x: rng.standard_normal(x.shape, np.float32), shapes) for _ in range(2)
  ]
  labels = jax.tree.map(
    lambda n: "muon" if axes_lib.uses_muon(n) else "adam", names, is_leaf=muon.is_axes_leaf
  )
  ref = optax.partition({"muon": muon.scale_by_muon(names), "adam": optax.identity()}, labels)
  state = ref.init(grads[0])
  update = jax.jit(ref.update).lower(grads[0], state).compile()
  expected = []
  for g in grads:
    u, state = update(g, state)
    expected.append(u)
  return dict(names=names, shapes=shapes, labels=labels, grads=grads, expected=expected)


def _shardings(tiny, layout):
  cfg = layouts.get_config(layout)
  return param_shardings(tiny["names"], make_meshes(cfg.mesh), cfg.rules, shapes=tiny["shapes"])


def _groups(tiny, layout):
  """[(group, shard count k, local matrices per device)] of every group of the layout."""
  shardings = _shardings(tiny, layout)
  muon_tree = jax.tree.map(
    lambda x, label: x if label == "muon" else optax.MaskedNode(), tiny["shapes"], tiny["labels"]
  )
  out = []
  for mesh, leaves in muon_leaves(muon_tree, tiny["names"], shardings).items():
    for g in plan_groups(leaves, mesh):
      k = math.prod(mesh.shape[a] for a in g.row_axes + g.col_axes)
      local = 0
      for leaf in g.leaves:
        shape = NamedSharding(mesh, leaf.spec).shard_shape(leaf.shape)
        local += math.prod(shape[i] for i in axes_lib.muon_dims(leaf.names)[0])
      out.append((g, k, local))
  return out


@pytest.mark.parametrize("layout", sorted(_SHARDED_GROUPS))
def test_shape_groups_match_hand_count(tiny, layout):
  groups = _groups(tiny, layout)
  assert sum(k > 1 for _, k, _ in groups) == _SHARDED_GROUPS[layout]
  # Every Muon leaf is in exactly one group, and some groups need padding to k matrices.
  n_muon = sum(label == "muon" for label in jax.tree.leaves(tiny["labels"]))
  assert sum(len(g.leaves) for g, _, _ in groups) == n_muon
  assert any(local % k for _, k, local in groups)


def _computations(hlo: str) -> dict[str, list[str]]:
  """{computation name: its instruction lines} of an HLO module's text."""
  comps, name = {}, None
  for line in re.sub(r"/\*.*?\*/", "", hlo).splitlines():  # drop /*index=5*/ comments
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if head:
      name = head.group(1)
      comps[name] = []
    elif line.startswith("}"):
      name = None
    elif name is not None:
      comps[name].append(line)
  return comps


def _reachable(comps: dict[str, list[str]], roots) -> set[str]:
  """Computations called (transitively) from `roots`: loop bodies, fusions, reducers."""
  seen, todo = set(), list(roots)
  while todo:
    c = todo.pop()
    if c in seen:
      continue
    seen.add(c)
    for line in comps[c]:
      for ref in _CALLS.findall(line):
        todo.extend(re.findall(r"%?([\w.\-]+)", ref.strip("{}")))
  return seen


def _ops(comps, names) -> list[str]:
  return [op for c in names for line in comps[c] for op in _OP.findall(line)]


def collective_report(hlo: str) -> dict:
  """Collective ops of a compiled module, those inside while loops, and the async pairs."""
  comps = _computations(hlo)
  bodies = [
    b.lstrip("%")
    for c in comps.values()
    for line in c
    if " while(" in line
    for b in re.findall(r"\bbody=(%?[\w.\-]+)", line)
  ]
  in_loops = _reachable(comps, bodies)

  def collectives(ops):  # an async collective counts once, by its start op
    return [op.removesuffix("-start") for op in ops if op.removesuffix("-start") in _COLLECTIVES]

  everywhere = _ops(comps, comps)
  return dict(
    loops=len(bodies),
    loops_with_dots=sum("dot" in _ops(comps, _reachable(comps, [b])) for b in bodies),
    collectives=collectives(everywhere),
    collectives_in_loops=collectives(_ops(comps, in_loops)),
    # `all-to-all-start` or an `async-start` wrapping the collective (`async-done` ends it).
    async_starts=sum(op in ("all-to-all-start", "async-start") for op in everywhere),
  )


# ~12 s per layout on 2 shared cores (one compile of the sharded update), so not `slow`.
@pytest.mark.parametrize("layout", _COMPILED)
def test_matches_single_device_muon_and_hlo(tiny, layout):
  shardings = _shardings(tiny, layout)
  opt = optax.partition(
    {"muon": sharded_scale_by_muon(tiny["names"], shardings), "adam": optax.identity()},
    tiny["labels"],
  )
  grads = [jax.device_put(g, shardings) for g in tiny["grads"]]
  state = jax.jit(opt.init)(grads[0])
  update = jax.jit(opt.update).lower(grads[0], state).compile()
  for g, want in zip(grads, tiny["expected"]):  # two steps: momentum and Nesterov terms
    got, state = update(g, state)
    chex.assert_trees_all_close(got, want, atol=1e-5, rtol=1e-5)  # padded groups included
  for (path, x), s in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(shardings)):
    assert x.sharding.is_equivalent_to(s, x.ndim), (jax.tree_util.keystr(path), x.sharding, s)

  report = collective_report(update.as_text())
  groups = _groups(tiny, layout)
  # One Newton-Schulz loop per shape group (the scan stays a loop), each a chain of matmuls
  # with no collective inside; the only collectives are one all-to-all per sharded group
  # each way (momentum, scaling and the update's layout never communicate).
  assert report["loops"] == report["loops_with_dots"] == len(groups), report
  assert report["collectives_in_loops"] == [], report
  n_a2a = 2 * _SHARDED_GROUPS[layout]
  assert report["collectives"] == ["all-to-all"] * n_a2a, report
  if jax.default_backend() in ("gpu", "tpu"):  # async collectives: start/done pairs
    assert report["async_starts"] == n_a2a, report


def test_chunked_newton_schulz_on_each_device_matches_single_device(tiny):
  """`ns_batch_elements=1`: each device orthogonalizes its whole matrices one at a time
  (a loop around each group's Newton-Schulz loop), with the same updates."""
  layout = "cp2_ep8"
  shardings = _shardings(tiny, layout)
  opt = optax.partition(
    {
      "muon": sharded_scale_by_muon(tiny["names"], shardings, ns_batch_elements=1),
      "adam": optax.identity(),
    },
    tiny["labels"],
  )
  grads = [jax.device_put(g, shardings) for g in tiny["grads"]]
  state = jax.jit(opt.init)(grads[0])
  update = jax.jit(opt.update).lower(grads[0], state).compile()
  for g, want in zip(grads, tiny["expected"]):
    got, state = update(g, state)
    chex.assert_trees_all_close(got, want, atol=1e-5, rtol=1e-5)
  report = collective_report(update.as_text())
  # after the all-to-all a device holds ceil(local / k) whole matrices of a group
  chunked = sum(-(-local // k) > 1 for _, k, local in _groups(tiny, layout))
  assert chunked and report["loops"] == len(_groups(tiny, layout)) + chunked, report
  assert report["collectives_in_loops"] == [], report


def test_plain_muon_on_sharded_leaf_communicates_inside_the_loop():
  """Control for the HLO check: per-leaf Muon left to GSPMD on a row-sharded matrix puts
  collectives inside every Newton-Schulz iteration, and `collective_report` sees them."""
  mesh = make_meshes(layouts.get_config("fsdp").mesh).dense
  names = {"w": ("embed", "mlp")}
  g = {
    "w": jax.device_put(
      np.ones((64, 32), np.float32), NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp", None))
    )
  }
  opt = muon.scale_by_muon(names)
  update = jax.jit(opt.update).lower(g, opt.init(g)).compile()
  report = collective_report(update.as_text())
  assert report["loops"] == 1 and report["collectives_in_loops"], report


def test_rejects_non_named_sharding():
  names = {"w": ("embed", "mlp")}
  opt = sharded_scale_by_muon(names, {"w": jax.sharding.SingleDeviceSharding(jax.devices()[0])})
  g = {"w": np.ones((8, 8), np.float32)}
  with pytest.raises(ValueError, match="needs a NamedSharding per leaf"):
    opt.update(g, opt.init(g))
