"""Export to HF format: exact round trip, fp8 re-quantization, sharding, the CLI."""

import json
import os

import chex
import ml_dtypes
import numpy as np
import pytest

from composer_jax.hf import importer, quant, writer
from composer_jax.hf.reader import SafetensorsDir
from tests.hf import helpers


def _export(variables, out, **kw):
  writer.export_hf(helpers.CFG, lambda p: writer.leaf(variables, p), str(out), **kw)
  return str(out)


def test_roundtrip_exact_and_sharded(tmp_path):
  x = helpers.random_variables()
  out = _export(x, tmp_path, dtype="float32", max_shard_bytes=200_000)
  with open(os.path.join(out, writer.INDEX_FILE)) as f:
    weight_map = json.load(f)["weight_map"]
  shards = sorted(set(weight_map.values()))
  assert len(shards) > 1 and shards[-1].endswith(f"-of-{len(shards):05d}.safetensors")
  assert set(weight_map) == set(SafetensorsDir(out).infos)
  # scan_layers is how our code runs the stack, not part of the HF config: passed like dtype.
  cfg, back = importer.load_hf(out, scan_layers=helpers.CFG.scan_layers)
  assert cfg == helpers.CFG
  chex.assert_trees_all_equal(back, x)


def test_fp8_export(tmp_path):
  x = helpers.random_variables()
  out = _export(x, tmp_path, fp8=True)
  sd = SafetensorsDir(out)
  fp8 = {n for n, i in sd.infos.items() if i.dtype == "F8_E4M3"}
  assert "model.layers.0.mlp.gate_proj.weight" in fp8
  assert "model.layers.1.mlp.experts.2.down_proj.weight" in fp8
  assert all(n + "_scale_inv" in sd for n in fp8)
  assert sd.infos["model.layers.1.mlp.gate.weight"].dtype == "BF16"  # router stays unquantized
  assert sd.infos["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == "F32"
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["quantization_config"]["weight_block_size"] == [128, 128]
  _, back = importer.load_hf(out)
  w = x["params"]["moe_layers"]["attn"]["kv_b"]["kernel"]
  g = np.asarray(back["params"]["moe_layers"]["attn"]["kv_b"]["kernel"])
  # One 128x128 block per tiny tensor: error <= |w|/16 + subnormal spacing of its scale.
  scale = np.abs(w).max() / quant.FP8_MAX
  assert 0 < np.abs(g - w).max() and np.all(np.abs(g - w) <= np.abs(w) / 16 + scale * 2.0**-9)
  bf16 = x["params"]["embed"]["embedding"].astype(ml_dtypes.bfloat16).astype(np.float32)
  chex.assert_trees_all_equal(np.asarray(back["params"]["embed"]["embedding"]), bf16)


def test_gqa_is_not_exportable(tmp_path):
  cfg = helpers.CFG.replace(attention="gqa")
  with pytest.raises(ValueError, match="attention='gqa'"):
    writer.export_hf(cfg, lambda p: None, str(tmp_path))


def test_non_finite_weights_are_not_exported(tmp_path):
  x = helpers.random_variables()
  x["params"]["moe_layers"]["attn"]["kv_b"]["kernel"][1, 3, 0] = np.nan
  with pytest.raises(ValueError, match=r"^model.layers.2.self_attn.kv_b_proj.weight holds NaN/inf"):
    _export(x, tmp_path / "out")
