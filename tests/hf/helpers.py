"""Shared fixtures for tests/hf: random variables and HF checkpoint surgery."""

import json
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import save_file

from composer_jax.hf import names
from composer_jax.hf.reader import SafetensorsDir
from composer_jax.model.config import get_preset

# The CLIs run in a subprocess on one CPU device (not the 8 fake devices of conftest).
CLI_ENV = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run_python(*args) -> subprocess.CompletedProcess:
  """`python ARGS` from the repository root with `CLI_ENV`, output captured as text."""
  return subprocess.run(
    [sys.executable, *args], cwd=REPO, env=CLI_ENV, capture_output=True, text=True, timeout=300
  )


CFG = get_preset("tiny", num_layers=3, n_routed_experts=4, n_group=2, topk_group=1)


def random_variables(cfg=CFG, seed=0):
  rng = np.random.default_rng(seed)
  tree: dict = {}
  for path, shape in names.param_shapes(cfg).items():
    node = tree
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = rng.normal(0, 0.1, shape).astype(np.float32)
  return tree


def read_dir(hf_dir):
  """(config dict, {name: np.ndarray}) of a small HF checkpoint."""
  sd = SafetensorsDir(str(hf_dir))
  with open(os.path.join(hf_dir, "config.json")) as f:
    return json.load(f), {n: np.array(sd.get(n)) for n in sd.infos}


def write_dir(hf_dir, config, tensors):
  os.makedirs(hf_dir, exist_ok=True)
  with open(os.path.join(hf_dir, "config.json"), "w") as f:
    json.dump(config, f)
  save_file(tensors, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
  return str(hf_dir)
