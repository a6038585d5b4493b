"""The one range check of config numbers (`train.config.check_ranges` over `RANGES`)."""

import math

import pytest

from composer_jax.train import loop
from composer_jax.train.config import Range, check_ranges
from experiments.configs import base


def test_defaults_of_every_section_are_in_range():
  base.check_numbers(base.get_base_config())


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("optim.lr", -0.01, "optim.lr=-0.01 must be finite and >= 0 (a negative rate would ascend"),
    ("optim.adam_lr", math.inf, "optim.adam_lr=inf must be finite and >= 0"),
    ("optim.min_lr_ratio", 1.5, "optim.min_lr_ratio=1.5 must be in [0, 1]"),
    ("optim.b2", 1.0, "optim.b2=1.0 must be in [0, 1)"),
    ("optim.eps", 0.0, "optim.eps=0.0 must be finite and > 0"),
    ("train.steps", 0, "train.steps=0 must be >= 1"),
    ("train.z_loss", -1e-4, "train.z_loss=-0.0001 must be finite and >= 0"),
    ("data.validation_fraction", math.nan, "data.validation_fraction=nan must be in [0, 1)"),
    ("data.validation_fraction", -0.1, "data.validation_fraction=-0.1 must be in [0, 1)"),
    ("rl.group_size", 1, "rl.group_size=1 must be >= 2 (group-relative advantages"),
    ("rl.groups", 0, "rl.groups=0 must be >= 1"),
    ("rl.top_p", 0.0, "rl.top_p=0.0 must be in (0, 1] (1 = no nucleus truncation)"),
    ("rl.temperature", math.nan, "rl.temperature=nan must be finite and >= 0 (0 = greedy)"),
    ("rl.epochs", 0, "rl.epochs=0 must be >= 1"),
  ],
)
def test_a_number_out_of_range_is_one_line_naming_field_value_and_range(field, value, message):
  c = base.get_base_config()
  section, name = field.split(".")
  with c.unlocked():
    c[section][name] = value
  with pytest.raises(ValueError) as e:
    base.check_numbers(c)
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_trainer_checks_the_same_table():
  # A library caller of train.loop gets the check without experiments.run.
  c = base.get_base_config()
  c.optim.lr = -0.02
  with pytest.raises(ValueError, match=r"optim.lr=-0.02 must be finite and >= 0"):
    loop.validate(c)


def test_range_bounds_open_and_closed():
  assert Range(0, 1).contains(0) and Range(0, 1).contains(1)
  assert not Range(0, 1, lo_open=True).contains(0)
  assert not Range(0, 1, hi_open=True).contains(1)
  assert not Range().contains(math.nan) and Range().contains(-3)
  assert not Range(integer=True).contains(1.0) and not Range(integer=True).contains(True)
  with pytest.raises(ValueError, match=r"^t.steps=2.5 must be an integer >= 1$"):
    check_ranges({"t": {"steps": 2.5}}, {"t.steps": Range(1, integer=True)})
  with pytest.raises(ValueError, match="x.y='a' must be finite"):
    check_ranges({"x": {"y": "a"}}, {"x.y": Range()})


@pytest.mark.parametrize(
  "name", ["default", "small", "kimi_k2_continued", "rl_coding", "rl_tool_feedback"]
)
def test_every_run_config_is_in_range(name):
  import importlib

  base.check_numbers(importlib.import_module(f"experiments.configs.{name}").get_config())
