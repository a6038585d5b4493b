"""The run-config schema shared by every experiment config (`get_base_config`): each section is
its package's `default_config()`, assembled here.

`program` picks what `experiments.run` runs: 'lm' (supervised, `train.loop`) or 'rl' (an RL
program, see `rl_tool_feedback.py`). Sections (all `ml_collections.ConfigDict`, every field
overridable as `--config.a.b=v`):

* `model`: every field of a `ModelConfig` preset (`composer_jax.model.config.preset_config`;
  default `tiny`): `--config.model.num_layers=2`; a config file picks another preset with
  `c.model = preset_config('small')`.
* `optim`: `composer_jax.optim.config.default_config()`; `total_steps` 0 = `train.steps`.
* `data`: `composer_jax.data.default_config()` (`paths` '' = the stdlib sources).
* `train`: `composer_jax.train.config.default_config()` (steps, batch, logging, checkpoints,
  init_from, dry_run, compile cache).
* `mesh`, `rules`: the parallel layout (`composer_jax.parallel`); `layout` names it. The
  default 'single' is one device.
* `rl`, `loss`: RL programs only (`composer_jax.rl.config`): sampling, batch shapes,
  colocated/disaggregated mode; the RL + self-distillation loss. An RL program's steps, seed,
  logging, checkpoints and optimizer are `train` and `optim` above.

Every number of the schema has its valid range in one table, `RANGES` (each package's
`RANGES`); `check_numbers(config)` raises one line for the first out of range, and
`experiments.run` calls it as soon as the config is read, for every program.

Every config file's `get_config(arg)` reads its argument (`--config=FILE.py:ARG`) with
`parse_arg`, big_vision's grammar.
"""

import ml_collections

from composer_jax import data, optim
from composer_jax.model import config as model_config
from composer_jax.parallel.mesh import default_mesh_config
from composer_jax.rl import config as rl_config
from composer_jax.train import config as train_config
from composer_jax.train.config import Range
from experiments.configs import layouts


def _convert(name: str, text: str, default):
  """`text` as the type of `default` (bools strictly: true/false, case-insensitive)."""
  if isinstance(default, bool):
    if text.lower() not in ("true", "false"):
      raise ValueError(f"config arg {name}={text!r} must be true or false")
    return text.lower() == "true"
  try:
    return type(default)(text)
  except ValueError:
    raise ValueError(f"config arg {name}={text!r} is not a {type(default).__name__}") from None


def parse_arg(arg: str | None, **options) -> ml_collections.ConfigDict:
  """The options of a config file's `get_config(arg)`, big_vision's grammar
  (`big_vision.configs.common.parse_arg`): `FILE.py:key=value,key=value,flag`.

  `options`: name -> default, in order; a given value is converted to the default's type. A
  bare `flag` sets a bool option to True. The first option may also be given by value alone, in
  first place: `rl_tool_feedback.py:sd,layout=fsdp_ep` is `arm=sd,layout=fsdp_ep`.

  Raises:
    ValueError: one line naming an unknown option or a value of the wrong type, and the
      options.
  """
  names = list(options)
  usage = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "none"
  given = {}
  for i, piece in enumerate(p for p in (arg or "").split(",") if p):
    key, eq, value = piece.partition("=")
    if not eq and isinstance(options.get(key), bool):
      value = "true"
    elif not eq and i == 0 and names:
      key, value = names[0], piece
    if key not in options or (not eq and not isinstance(options[key], bool) and i):
      raise ValueError(
        f"config arg {arg!r}: {piece!r} is not an option (key=value, the first "
        f"option's value alone first); options (defaults): {usage}"
      )
    given[key] = _convert(key, value, options[key])
  return ml_collections.ConfigDict({**options, **given})


def set_layout(config: ml_collections.ConfigDict, name: str) -> None:
  """Fills `config.mesh` / `config.rules` from a named layout ('single' = one device)."""
  if name != "single" and name not in layouts.LAYOUTS:
    raise ValueError(f"layout={name!r}; valid: {['single', *sorted(layouts.LAYOUTS)]}")
  if name == "single":
    layout = layouts.get_config()
    layout.mesh = default_mesh_config(fsdp=1, expert=1)
  else:
    layout = layouts.get_config(name)
  config.layout = name
  config.mesh = layout.mesh
  config.rules = layout.rules


# Token lengths an environment may derive from its tasks (0, e.g. rl_coding.py): when the config
# is read they may be 0; `rl.run.validate` checks them (>= 1) once derived, before any work.
_DERIVED = Range(0, integer=True, note="0 = derived from the environment's tasks")
RANGES = {
  **train_config.RANGES,
  **rl_config.RANGES,
  **{f"rl.{name}": _DERIVED for name in ("seq_len", "prompt_len", "teacher_seq_len")},
  # The coding environment's (`rl_coding.py`; `experiments.eval` reads them too).
  "env.heldout_fraction": Range(0, 1, note="the share of projects held out of RL for eval"),
  "env.max_turns": Range(1, integer=True),
  "env.workers": Range(1, integer=True),
}


def check_numbers(config: ml_collections.ConfigDict) -> None:
  """One-line ValueError naming the first field of `config` out of its range (`RANGES`)."""
  train_config.check_ranges(config, RANGES)


def get_base_config() -> ml_collections.ConfigDict:
  """Defaults for every field; experiment configs change what they need."""
  c = ml_collections.ConfigDict()
  c.method = "lm"  # what experiments.run runs: 'lm' (supervised) or 'rl'
  c.model = model_config.default_config()
  c.train = train_config.default_config()
  c.optim = optim.default_config()
  c.data = data.default_config()
  c.rl = rl_config.default_config()
  c.loss = rl_config.default_loss_config()
  set_layout(c, "single")
  return c
