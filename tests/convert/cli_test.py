"""export_hf / import_hf command lines: every bad input or output path is one line and leaves
the input (and an existing --out) as it was; a failed write (disk full) leaves nothing half
written; good runs read back exactly. Each tool's cases run in one subprocess."""

import hashlib
import json
import os
import shutil

import chex
import grain
import numpy as np

from composer_jax.hf import checkpoint, importer, writer
from composer_jax.train import checkpointing
from tests.hf import helpers

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Runs composer_jax.convert.<argv[1]>'s main once per case of argv[2] (JSON: [[argv, fail]]),
# printing one JSON list: None for a run that finished, else its exit message. `fail`
# makes the weights write fail like a full disk, after part of the output was written.
_DRIVER = r"""
import errno, importlib, json, sys
from absl import flags
from composer_jax.hf import checkpoint, writer
tool = importlib.import_module("composer_jax.convert." + sys.argv[1])
save_file, save = writer.save_file, checkpoint.save
def full(*a, **k):
  raise OSError(errno.ENOSPC, "No space left on device")
def half_save(ckpt_dir, cfg, variables):  # config.json written, then the disk fills
  with open(ckpt_dir + "/config.json", "w") as f:
    f.write("{}")
  full()
results = []
for argv, fail in json.loads(sys.argv[2]):
  writer.save_file = full if fail else save_file
  checkpoint.save = half_save if fail else save
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["tool", *argv])
  try:
    tool.main([])
    results.append(None)
  except SystemExit as e:
    results.append(str(e.code))
print(json.dumps(results))
"""


def _run(tool, cases):
  """Runs `cases` {name: (argv, fail, expected exit line or None for success)}; asserts
  each finished or exited with one line starting with what was expected."""
  argv = json.dumps([[a, fail] for a, fail, _ in cases.values()])
  proc = helpers.run_python("-c", _DRIVER, tool, argv)
  assert proc.returncode == 0, proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  for (name, (_, _, want)), msg in zip(cases.items(), got, strict=True):
    if want is None:
      assert msg is None, (name, msg)
    else:
      assert msg and msg.startswith(want) and "\n" not in msg, (name, msg)


def _digest(root):
  """{relative path: sha256} of every file under `root`."""
  out = {}
  for d, _, files in os.walk(root):
    for f in files:
      with open(os.path.join(d, f), "rb") as fh:
        out[os.path.relpath(os.path.join(d, f), root)] = hashlib.sha256(fh.read()).hexdigest()
  return out


def _workdir(path, variables):
  """A training workdir whose newest checkpoint holds `variables`."""
  ckpt = checkpointing.Checkpointer(str(path), keep=1)
  ckpt.save(1, variables, iter(grain.MapDataset.range(4).to_iter_dataset()), helpers.CFG, {})
  ckpt.close()
  return str(path)


def test_export_outputs(tmp_path):
  x = helpers.random_variables()
  ck = str(tmp_path / "ck")
  checkpoint.save(ck, helpers.CFG, x)
  wd = _workdir(tmp_path / "wd", x)
  (tmp_path / "file").write_text("")
  old = tmp_path / "old"  # another model's export
  old.mkdir()
  (old / "config.json").write_text("{}")
  (old / "model-00001-of-00003.safetensors").write_text("another model")
  mine = tmp_path / "mine"  # not an export: --overwrite must not replace it
  mine.mkdir()
  (mine / "notes.txt").write_text("mine")
  before = _digest(ck), _digest(mine)
  t = tmp_path
  cases = {
    "into_ckpt": (
      [f"--ckpt={ck}", f"--out={ck}"],
      False,
      f"error: --out {ck} is the input {ck}: pass another directory",
    ),
    "inside_ckpt": (
      [f"--ckpt={ck}", f"--out={ck}/hf", "--overwrite"],
      False,
      f"error: --out {ck}/hf is inside the input {ck}",
    ),
    "around_ckpt": (
      [f"--ckpt={ck}", f"--out={t}", "--overwrite"],
      False,
      f"error: --out {t} holds the input {ck}",
    ),
    "out_is_file": (
      [f"--ckpt={ck}", f"--out={t}/file"],
      False,
      f"error: --out {t}/file is a file, not a directory",
    ),
    "other_model": (
      [f"--ckpt={ck}", f"--out={old}"],
      False,
      f"error: --out {old} is not empty (it holds 'config.json' and 1 more); "
      "pass a new or empty directory or --overwrite to replace it",
    ),
    "not_an_export": (
      [f"--ckpt={ck}", f"--out={mine}", "--overwrite"],
      False,
      f"error: --out {mine} is not a Hugging Face directory (config.json + "
      "*.safetensors), so --overwrite does not replace it",
    ),
    "not_a_ckpt": (
      [f"--ckpt={t}/file", f"--out={t}/a"],
      False,
      f"error: checkpoint '{t}/file' is none of: an imported checkpoint",
    ),
    "disk_full": (
      [f"--ckpt={ck}", f"--out={old}", "--overwrite"],
      True,
      "error: [Errno 28] No space left on device",
    ),
    "workdir": ([f"--ckpt={wd}", f"--out={t}/from_wd", "--dtype=float32"], False, None),
    "overwrite": ([f"--ckpt={ck}", f"--out={old}", "--dtype=float32", "--overwrite"], False, None),
  }
  _run("export_hf", cases)
  assert (_digest(ck), _digest(mine)) == before  # the checkpoint is never written
  for out in (f"{t}/from_wd", str(old)):  # replaced whole: no shard of the other model left
    assert sorted(os.listdir(out)) == [
      "config.json",
      "model-00001-of-00001.safetensors",
      writer.INDEX_FILE,
    ]
    chex.assert_trees_all_equal(importer.load_hf(out)[1], x)
  assert sorted(os.listdir(t)) == ["ck", "file", "from_wd", "mine", "old", "wd"]  # no temporaries


def test_import_inputs_and_outputs(tmp_path):
  x = helpers.random_variables()
  hf = str(tmp_path / "hf")
  writer.export_hf(helpers.CFG, lambda p: writer.leaf(x, p), hf, dtype="float32")
  config, tensors = helpers.read_dir(hf)
  rope_str = helpers.write_dir(tmp_path / "rope_str", dict(config, rope_scaling="yarn"), tensors)
  outside = str(tmp_path / "outside")
  shutil.copytree(hf, outside)
  with open(f"{outside}/{writer.INDEX_FILE}") as f:
    index = json.load(f)
  index["weight_map"]["lm_head.weight"] = "../hf/model-00001-of-00001.safetensors"
  with open(f"{outside}/{writer.INDEX_FILE}", "w") as f:
    json.dump(index, f)
  cut = str(tmp_path / "cut")
  shutil.copytree(hf, cut)
  shard = f"{cut}/model-00001-of-00001.safetensors"
  os.truncate(shard, os.path.getsize(shard) - 100)
  done = tmp_path / "done"
  before = _digest(hf)
  t = tmp_path
  cases = {
    "into_hf": ([f"--hf_dir={hf}", f"--out={hf}"], False, f"error: --out {hf} is the input {hf}"),
    "rope_scaling_str": (
      [f"--hf_dir={rope_str}", f"--out={t}/a"],
      False,
      f"error: {rope_str}/config.json: config.json rope_scaling='yarn' "
      "must be a JSON object or null",
    ),
    "shard_outside": (
      [f"--hf_dir={outside}", f"--out={t}/a"],
      False,
      f"error: {outside}/{writer.INDEX_FILE} names shard "
      "'../hf/model-00001-of-00001.safetensors', not a file name in",
    ),
    "truncated": ([f"--hf_dir={cut}", f"--out={t}/a"], False, f"error: {shard}: truncated"),
    "ok": ([f"--hf_dir={hf}", f"--out={done}", "--dtype=bfloat16"], False, None),
    "not_empty": ([f"--hf_dir={hf}", f"--out={done}"], False, f"error: --out {done} is not empty"),
    "disk_full": (
      [f"--hf_dir={hf}", f"--out={done}", "--overwrite"],
      True,
      "error: [Errno 28] No space left on device",
    ),
  }
  _run("import_hf", cases)
  assert _digest(hf) == before
  assert not os.path.exists(t / "a")
  # The import survived the failed overwrite: bfloat16, exact up to rounding.
  assert checkpoint.load_config(str(done)).param_dtype == "bfloat16"
  got = checkpoint.load(str(done))
  chex.assert_trees_all_close(got, x, rtol=2**-8, atol=0)
  assert got["params"]["embed"]["embedding"].dtype.name == "bfloat16"
  assert got["router"]["moe_layers"]["moe"]["bias"].dtype == np.float32
  assert sorted(os.listdir(done)) == ["config.json", "variables"]
  assert not [n for n in os.listdir(t) if ".partial-" in n or ".replaced-" in n]
