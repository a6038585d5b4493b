"""Named parallel layouts: `mesh` + `rules` config sections, swapped by name.

    from experiments.configs import layouts
    cfg = layouts.get_config("cp2_ep8")       # cfg.mesh, cfg.rules
    dm = make_meshes(cfg.mesh); shardings = param_shardings(axes, dm, cfg.rules)

Sizes of -1 absorb the remaining devices, so a layout runs on any device count
its fixed sizes divide. Layouts (shown for 8 devices):

| name      | dense view (replica x fsdp x context x tensor) | expert view (expert_replica x expert) |
|-----------|-----------------------------------------------|---------------------------------------|
| fsdp      | 1 x 8 x 1 x 1                                 | 1 x 8, `expert` shards expert embed   |
| hsdp      | 2 x 4 x 1 x 1  (fsdp = one 4-device "node")   | 1 x 8, experts over `expert` (EP 8)   |
| fsdp_ep   | 1 x 8 x 1 x 1                                 | 1 x 8, EP 8                           |
| fsdp_tp   | 1 x 4 x 1 x 2                                 | 1 x 8, EP 8                           |
| cp2_ep8   | 1 x 4 x 2 x 1                                 | 1 x 8, EP 8 — one shared mesh needs 16 |

In `fsdp` the routed experts are not expert-parallel: the expert view's single
wide axis shards their embed dim (ZeRO-3 over all devices), like every other
weight.
"""

import ml_collections

from composer_jax.parallel.mesh import default_mesh_config
from composer_jax.parallel.rules import default_rules
from composer_jax.rl.mesh import sampler_rules

_EXPERT_FSDP_RULES = [
  ("layers", None),
  ("experts", None),
  ("embed", "expert"),
  ("expert_mlp", None),
  ("batch", ("expert_replica", "expert")),
  ("act_embed", None),
]

LAYOUTS = {
  "fsdp": dict(mesh=dict(), expert_rules=_EXPERT_FSDP_RULES),
  "hsdp": dict(mesh=dict(replica=-1, fsdp=4)),
  "fsdp_ep": dict(mesh=dict()),
  "fsdp_tp": dict(mesh=dict(fsdp=-1, tensor=2)),
  "cp2_ep8": dict(mesh=dict(fsdp=-1, context=2, expert=8)),
}


def get_config(arg: str = "fsdp_ep") -> ml_collections.ConfigDict:
  """Config with `mesh` (see `composer_jax.parallel.mesh`) and `rules` sections (`dense`,
  `expert`; `sampler`: the RL sampler's mesh, `composer_jax.rl.mesh.SamplerMesh`)."""
  if arg not in LAYOUTS:
    raise ValueError(f"Unknown layout {arg!r}; valid layouts: {sorted(LAYOUTS)}")
  layout = LAYOUTS[arg]
  rules = default_rules()
  if "expert_rules" in layout:
    rules.expert = list(layout["expert_rules"])
  rules.sampler = sampler_rules()
  return ml_collections.ConfigDict(
    dict(name=arg, mesh=default_mesh_config(**layout["mesh"]), rules=rules)
  )
