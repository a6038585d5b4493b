"""Importer: quantized checkpoints, MTP / multimodal skipping, streaming CLI, bad input."""

import json
import os
import shutil
import subprocess
import sys

import chex
import numpy as np
import pytest

from composer_jax.hf import checkpoint, importer, quant, writer
from tests.hf import helpers


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """(variables, float32 HF checkpoint dir written from them)."""
  variables = helpers.random_variables()
  out = tmp_path_factory.mktemp("hf")
  writer.export_hf(helpers.CFG, lambda p: writer.leaf(variables, p), str(out), dtype="float32")
  return variables, str(out)


def _mutated(exported, tmp_path, fn):
  config, tensors = helpers.read_dir(exported[1])
  fn(config, tensors)
  return helpers.write_dir(tmp_path / "mutated", config, tensors)


def _expert_names(tensors):
  return [n for n in tensors if ".mlp.experts." in n]


def test_int4_experts(exported, tmp_path):
  """Kimi-K2-Thinking layout: routed experts packed int4, everything else bf16/float."""

  def to_int4(config, tensors):
    for name in _expert_names(tensors):
      base = name[: -len(".weight")]
      packed, scale, shape = quant.quantize_int4_packed(tensors.pop(name), group_size=32)
      tensors.update(
        {
          base + ".weight_packed": packed,
          base + ".weight_scale": scale,
          base + ".weight_shape": shape,
        }
      )

  _, got = importer.load_hf(_mutated(exported, tmp_path, to_int4))
  want = exported[0]
  for proj in ("gate", "up", "down"):
    w = want["params"]["moe_layers"]["moe"]["experts"][proj]
    g = np.asarray(got["params"]["moe_layers"]["moe"]["experts"][proj])
    step = np.abs(w).max() / 7.5  # bound on any group's scale
    assert 0 < np.abs(g - w).max() <= step / 2 + 1e-6
  chex.assert_trees_all_equal(got["params"]["embed"], want["params"]["embed"])


def test_fp8_without_scale(exported, tmp_path):
  name = "model.layers.1.self_attn.o_proj.weight"

  def drop_scale(config, tensors):
    tensors[name] = quant.quantize_fp8_block(tensors[name])[0]

  with pytest.raises(
    ValueError, match=f"fp8 tensor '{name}' has no block scale '{name}_scale_inv'"
  ):
    importer.load_hf(_mutated(exported, tmp_path, drop_scale))


@pytest.mark.parametrize(
  "mutate,match",
  [
    (
      lambda c, t: t.update(
        {
          "model.layers.1.self_attn.q_a_proj.weight": t[
            "model.layers.1.self_attn.q_a_proj.weight"
          ].T.copy()
        }
      ),
      r"Tensor 'model.layers.1.self_attn.q_a_proj.weight' has shape \(64, 32\), expected "
      r"\(32, 64\) from config.json",
    ),
    (
      lambda c, t: t.update(
        {"model.layers.2.mlp.experts.3.down_proj.weight": np.zeros((64, 31), np.float32)}
      ),
      r"Tensor 'model.layers.2.mlp.experts.3.down_proj.weight' has shape \(64, 31\), "
      r"expected \(64, 32\)",
    ),
    (
      lambda c, t: t.pop("model.layers.2.mlp.experts.3.up_proj.weight"),
      r"Missing tensor 'model.layers.2.mlp.experts.3.up_proj.weight' \(expected shape "
      r"\(32, 64\)\)",
    ),
    (
      lambda c, t: t.update({"model.layers.0.mlp.extra.weight": np.zeros(2, np.float32)}),
      r"1 unexpected tensor\(s\).*model.layers.0.mlp.extra.weight",
    ),
    (lambda c, t: c.update(model_type="qwen2"), "Unsupported model_type='qwen2'"),
    (lambda c, t: c.update(hidden_size=48), "has shape"),
    # Counts beyond the tensors are refused before the per-tensor list is built (10^12 layers
    # were enumerated: the import ran until memory ran out).
    (
      lambda c, t: c.update(num_hidden_layers=10**12),
      r"config.json num_hidden_layers=1000000000000, but the checkpoint's tensors hold 3 layers",
    ),
    (
      lambda c, t: c.update(n_routed_experts=10**9, n_group=1, topk_group=1),
      r"config.json n_routed_experts=1000000000, but the checkpoint's tensors hold 4 experts",
    ),
  ],
)
def test_bad_checkpoints(exported, tmp_path, mutate, match):
  with pytest.raises(ValueError, match=match):
    importer.load_hf(_mutated(exported, tmp_path, mutate))


def _cut(path, size):
  os.truncate(path, size if size >= 0 else os.path.getsize(path) + size)


def _index(hf_dir, shard):
  """Re-points lm_head.weight in the index to `shard`."""
  path = os.path.join(hf_dir, "model.safetensors.index.json")
  with open(path) as f:
    index = json.load(f)
  index["weight_map"]["lm_head.weight"] = shard
  with open(path, "w") as f:
    json.dump(index, f)


_SHARD = "model-00001-of-00001.safetensors"
_BAD_FILES = {  # fault -> (how, the one-line error; {d} is the checkpoint dir)
  "truncated_shard": (
    lambda d: _cut(f"{d}/{_SHARD}", -100),
    "{d}/" + _SHARD + ": truncated: its header describes",
  ),
  "cut_header": (
    lambda d: _cut(f"{d}/{_SHARD}", 20),
    "{d}/" + _SHARD + ": safetensors header cut short (file has 20 bytes",
  ),
  "zero_byte_shard": (
    lambda d: _cut(f"{d}/{_SHARD}", 0),
    "{d}/" + _SHARD + ": empty file (0 bytes)",
  ),
  "indexed_shard_missing": (
    lambda d: _index(d, "model-00002-of-00002.safetensors"),
    "{d}/model.safetensors.index.json names shard "
    "'model-00002-of-00002.safetensors' (1 tensors, e.g. "
    "'lm_head.weight'), but {d}/model-00002-of-00002.safetensors "
    "is missing",
  ),
  "config_not_json": (
    lambda d: open(f"{d}/config.json", "w").write("{'model_type': "),
    "{d}/config.json: not valid JSON (Expecting property name",
  ),
  "unknown_model_type": (
    lambda d: json.dump({"model_type": "llama"}, open(f"{d}/config.json", "w")),
    "{d}/config.json: Unsupported model_type='llama'; supported: ('deepseek_v3', 'kimi_k2')",
  ),
}


@pytest.mark.parametrize("fault", sorted(_BAD_FILES))
def test_bad_files_one_line(exported, tmp_path, fault):
  hf_dir = str(tmp_path / "hf")
  shutil.copytree(exported[1], hf_dir)
  make, expected = _BAD_FILES[fault]
  make(hf_dir)
  with pytest.raises((ValueError, FileNotFoundError)) as e:
    importer.load_hf(hf_dir)
  assert str(e.value).startswith(expected.format(d=hf_dir)), str(e.value)
  assert "\n" not in str(e.value)


def test_mtp_layers_skipped_only_when_declared(exported, tmp_path):
  mtp = "model.layers.3.eh_proj.weight"  # layer index == num_hidden_layers: an MTP layer

  def add_mtp(declared):
    return lambda c, t: (
      t.update({mtp: np.zeros((64, 128), np.float32)}),
      c.update(num_nextn_predict_layers=declared),
    )

  _, got = importer.load_hf(_mutated(exported, tmp_path / "a", add_mtp(1)))
  chex.assert_trees_all_equal(got, exported[0])
  with pytest.raises(ValueError, match="unexpected tensor.*eh_proj"):
    importer.load_hf(_mutated(exported, tmp_path / "b", add_mtp(0)))


def test_kimi_k25_nested_layout(exported, tmp_path):
  """Text config under text_config, tensors under language_model., vision tensors skipped."""

  def nest(config, tensors):
    text = dict(config)
    config.clear()
    config.update(model_type="kimi_k25", text_config=dict(text, model_type="kimi_k2"))
    for name in list(tensors):
      tensors["language_model." + name] = tensors.pop(name)
    tensors["vision_tower.patch_embed.proj.weight"] = np.zeros((4, 3), np.float32)

  _, got = importer.load_hf(_mutated(exported, tmp_path, nest))
  chex.assert_trees_all_equal(got, exported[0])


def test_streaming_cli_import(exported, tmp_path):
  out = tmp_path / "ckpt"
  subprocess.run(
    [
      sys.executable,
      "-m",
      "composer_jax.convert.import_hf",
      "--hf-dir",
      exported[1],
      f"--out={out}",
      "--dtype=bfloat16",
    ],
    check=True,
    env=helpers.CLI_ENV,
  )
  assert checkpoint.load_config(str(out)).param_dtype == "bfloat16"
  got = checkpoint.load(str(out))
  assert not (out / "staging").exists()
  want = exported[0]
  chex.assert_trees_all_equal_structs(got, want)
  chex.assert_trees_all_close(got, want, rtol=2**-8, atol=0)  # bfloat16 rounding
  assert got["params"]["embed"]["embedding"].dtype.name == "bfloat16"
  assert got["router"]["moe_layers"]["moe"]["bias"].dtype == np.float32
