"""convert.outputs: an output directory is checked before any work and appears whole or not at all."""

import os

import pytest

from composer_jax.convert import outputs


@pytest.fixture
def tree(tmp_path):
  """tmp/src/ (an input holding data), tmp/file, tmp/full/ (foreign content), tmp/empty/."""
  (tmp_path / "src").mkdir()
  (tmp_path / "src" / "config.json").write_text("{}")
  (tmp_path / "file").write_text("x")
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "model-00001-of-00002.safetensors").write_text("other model")
  (tmp_path / "full" / "eval.json").write_text("{}")
  (tmp_path / "empty").mkdir()
  return tmp_path


@pytest.mark.parametrize(
  "out, kwargs, error",
  [
    ("src", {}, "--out {t}/src is the input {t}/src: pass another directory"),
    ("src", {"overwrite": True}, "is the input"),  # --overwrite never touches an input
    ("src/hf", {}, "--out {t}/src/hf is inside the input {t}/src"),
    (".", {}, "--out {t}/. holds the input {t}/src"),
    ("file", {}, "--out {t}/file is a file, not a directory"),
    ("file/sub/dir", {}, "--out {t}/file/sub/dir: it is under {t}/file, which is not a directory"),
    (
      "full",
      {"is_own": (lambda p: True, "")},
      "--out {t}/full is not empty (it holds "
      "'eval.json' and 1 more); pass a new or empty directory or --overwrite to replace it",
    ),
    ("full", {"replaceable": ["eval.json"]}, "it holds 'model-00001-of-00002.safetensors')"),
    ("src/eval", {"inside_inputs": True}, None),  # e.g. eval's default <checkpoint>/eval
    ("full", {"overwrite": True}, "is not empty"),  # nothing says it is the tool's own
    (
      "full",
      {"overwrite": True, "is_own": (lambda p: False, "an HF checkpoint")},
      "--out {t}/full is not an HF checkpoint, so --overwrite does not replace it",
    ),
    ("full", {"overwrite": True, "is_own": (lambda p: p.endswith("/full"), "")}, None),
    ("empty", {}, None),
    ("new/sub", {}, None),
  ],
)
def test_check(tree, out, kwargs, error):
  path = f"{tree}/{out}"
  if error is None:
    assert outputs.check(path, inputs=[f"{tree}/src"], **kwargs) == os.path.realpath(path)
  else:
    with pytest.raises(ValueError) as e:
      outputs.check(path, inputs=[f"{tree}/src"], **kwargs)
    assert error.format(t=tree) in str(e.value) and "\n" not in str(e.value)


def test_staged_replaces_whole_or_leaves_as_it_was(tree):
  out = str(tree / "full")
  with pytest.raises(OSError), outputs.staged(out) as tmp:  # e.g. disk full half-way
    (tree / tmp / "model-00001-of-00001.safetensors").write_text("new")
    raise OSError(28, "No space left on device")
  assert sorted(os.listdir(out)) == ["eval.json", "model-00001-of-00002.safetensors"]
  with outputs.staged(out) as tmp:
    (tree / tmp / "model-00001-of-00001.safetensors").write_text("new")
  assert os.listdir(out) == ["model-00001-of-00001.safetensors"]  # nothing old mixed in
  assert sorted(os.listdir(tree)) == ["empty", "file", "full", "src"]  # no temporary left
  mask = os.umask(0)
  os.umask(mask)
  assert os.stat(out).st_mode & 0o777 == 0o777 & ~mask
