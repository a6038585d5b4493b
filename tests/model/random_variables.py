"""Random model variables without compiling `transformer.init` (seconds of CPU per config)."""

import jax
import numpy as np

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig


def random_variables(
  cfg: ModelConfig, seed: int = 0, std: float = 0.1, head_std: float = 0.3
) -> dict:
  """`transformer.init`-shaped variables: N(0, std) weights and router biases, norm scales
  1 + N(0, std), and an output head of `head_std` so next-token distributions are peaked."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))

  def leaf(path, s):
    names = [getattr(p, "key", None) for p in path]
    sd = head_std if "lm_head" in names else std
    x = rng.normal(0.0, sd, s.shape) + (names[-1] == "scale")
    return jax.numpy.asarray(x, s.dtype)

  return jax.tree_util.tree_map_with_path(leaf, shapes)
