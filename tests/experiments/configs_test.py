"""The run configs: every field is its own (no FieldReference links two), the LR schedule's
length follows `train.steps` only while `optim.total_steps` is 0, one `get_config(arg)` grammar."""

import dataclasses
import glob
import importlib
import os
import re

import ml_collections
import pytest

from composer_jax.model import config as model_config
from composer_jax.train import config as train_config
from experiments.configs import default, rl_coding, rl_tool_feedback

_CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "configs")
# Every run config file with each of its named settings.
_ARGS = {
  "default": [None, "fsdp_ep"],
  "rl_tool_feedback": ["sd", "rl,behaviour=verbose"],
  "rl_coding": ["cpu", "pod", "micro"],
}


def _run_configs():
  for path in sorted(glob.glob(os.path.join(_CONFIG_DIR, "*.py"))):
    name = os.path.basename(path)[:-3]
    if name in ("__init__", "base", "layouts"):
      continue
    module = importlib.import_module(f"experiments.configs.{name}")
    for arg in _ARGS.get(name, [None]):
      yield f"{name}:{arg}", lambda m=module, a=arg: m.get_config(a)


def _leaves(c, prefix=()):
  for k, v in c.items():
    if isinstance(v, ml_collections.ConfigDict):
      yield from _leaves(v, (*prefix, k))
    else:
      yield (*prefix, k), v


def _other(value):
  """Another value of `value`'s type (None: a leaf this test does not set)."""
  if type(value) is bool:
    return not value
  if type(value) in (int, float):
    return value + 7
  if type(value) is str:
    return value + "_x"
  if type(value) is tuple:
    return (*value, "x")
  return None


@pytest.mark.parametrize(
  "name,make", list(_run_configs()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_setting_one_field_changes_no_other(name, make):
  """A field linked to another (a FieldReference, or one section object under two names)
  would change with it: set each number, string, flag and tuple of a fresh config, then every
  other field must read as before."""
  before = dict(_leaves(make()))
  fields = [p for p, v in before.items() if _other(v) is not None]
  assert len(fields) > 60, name
  for path in fields:
    c = make()
    section = c
    for k in path[:-1]:
      section = section[k]
    section[path[-1]] = _other(before[path])
    changed = [p for p, v in _leaves(c) if v != before[p]]
    assert changed == [path], f"{name}: setting {'.'.join(path)} also set {changed}"


@pytest.mark.parametrize(
  "name,make", list(_run_configs()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_every_model_field_is_in_every_config(name, make):
  """`config.model` holds every `ModelConfig` field, so `--config.model.FIELD=V` works on
  every config; setting one reaches the model built from it."""
  c = make()
  assert set(c.model.keys()) == {f.name for f in dataclasses.fields(model_config.ModelConfig)}
  c.model.num_layers = 2
  assert model_config.model_config(c.model).num_layers == 2, name


def test_total_steps_follows_train_steps_only_while_0():
  c = default.get_config()
  assert c.optim.total_steps == 0 and train_config.optim_config(c).total_steps == 300
  c.train.steps = 50
  assert train_config.optim_config(c).total_steps == 50
  c.optim.total_steps = 1000  # a schedule longer than this run (stopped early, resumed later)
  assert c.train.steps == 50 and train_config.optim_config(c).total_steps == 1000
  c.train.steps = 20  # in either order
  assert train_config.optim_config(c).total_steps == 1000 and c.optim.total_steps == 1000
  # The RL programs' configs too (the tool program's warm-up has its own optimizer section).
  for c in (rl_tool_feedback.get_config("sd"), rl_coding.get_config("cpu")):
    c.optim.total_steps = 9
    assert c.train.steps != 9


def test_parse_arg_is_big_vision_grammar():
  from experiments.configs import base

  parse = lambda arg: base.parse_arg(arg, arm="sd", steps=3, lr=0.5, smoke=False).to_dict()
  assert parse(None) == dict(arm="sd", steps=3, lr=0.5, smoke=False)
  assert parse("rl") == dict(arm="rl", steps=3, lr=0.5, smoke=False)  # first option by value
  assert parse("rl,steps=7,lr=1e-3,smoke") == dict(arm="rl", steps=7, lr=1e-3, smoke=True)
  assert parse("smoke=False,arm=penalty") == dict(arm="penalty", steps=3, lr=0.5, smoke=False)
  for arg, message in [
    ("sd,rl", "'rl' is not an option"),  # only the first option by value, only first
    ("sd,steps", "'steps' is not an option"),
    (
      "sd,step=2",
      "'step=2' is not an option (key=value, the first option's value alone first); "
      "options (defaults): arm='sd', steps=3, lr=0.5, smoke=False",
    ),
    ("steps=x", "config arg steps='x' is not a int"),
    ("smoke=yes", "config arg smoke='yes' must be true or false"),
  ]:
    with pytest.raises(ValueError, match=re.escape(message)):
      parse(arg)
  # Every run config reads its arg this way.
  assert default.get_config("fsdp_ep").layout == default.get_config("layout=fsdp_ep").layout
  c = rl_tool_feedback.get_config("penalty,behaviour=verbose,layout=fsdp")
  assert (c.arm, c.behaviour, c.layout) == ("penalty", "verbose", "fsdp")
  with pytest.raises(ValueError, match=r"layout='fsdp9'; valid: \['single', 'cp2_ep8'"):
    rl_tool_feedback.get_config("sd,layout=fsdp9")
  assert model_config.model_config(rl_coding.get_config("pod").model) == model_config.get_preset(
    "kimi_k2"
  )
