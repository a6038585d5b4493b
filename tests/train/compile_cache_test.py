"""The persistent compilation cache's checks: an untrusted directory is refused in one line;
a foreign, world-writable, linked, special or truncated entry is deleted with a warning naming
it (the program is compiled again) and nothing else in the directory is touched; every program
(LM and RL runs) uses the run's cache setting."""

import os
import sys
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from composer_jax.rl import run as rl_run
from composer_jax.train import compile_cache
from experiments.configs import rl_tool_feedback


def test_untrusted_directory_is_one_line(tmp_path):
  shared = tmp_path / "shared"
  shared.mkdir(mode=0o777)
  os.chmod(shared, 0o777)  # (mkdir's mode goes through the umask)
  with pytest.raises(ValueError) as e:
    compile_cache.enable(str(shared))
  assert str(e.value).startswith(
    f"train.compile_cache_dir {shared} is writable by its group or "
    "others (mode drwxrwxrwx): a compiled program read from it "
  )
  (tmp_path / "file").write_text("")
  with pytest.raises(ValueError, match="is not a directory"):
    compile_cache.enable(str(tmp_path / "file"))
  if os.getuid() == 0:  # root can make a directory another user owns
    other = tmp_path / "other"
    other.mkdir(mode=0o755)
    os.chown(other, 1000, 1000)
    with pytest.raises(ValueError, match=r"is owned by uid 1000, not this user \(0\)"):
      compile_cache.enable(str(other))


def _compiled_entry(directory) -> str:
  """A real cache entry: a function compiled with the cache on `directory`, then the cache
  pointed back where it was (JAX opens its cache once per process: read its file here)."""
  from jax._src import compilation_cache as cc

  cc.reset_cache()
  saved = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  try:
    np.testing.assert_allclose(
      jax.jit(lambda x: jnp.tanh(x) * 3.0)(np.ones(3, np.float32)),
      np.tanh(np.ones(3)) * 3.0,
      rtol=1e-6,
    )
  finally:
    cc.reset_cache()
    jax.config.update("jax_compilation_cache_dir", saved)
  (name,) = [f for f in os.listdir(directory) if f.endswith("-cache")]
  return name


def test_bad_entries_are_deleted_with_a_warning_naming_them(tmp_path, caplog):
  good = _compiled_entry(tmp_path)
  blob = (tmp_path / good).read_bytes()
  (tmp_path / "truncated-cache").write_bytes(blob[: len(blob) // 2])  # a write cut short
  (tmp_path / "writable-cache").write_bytes(blob)
  os.chmod(tmp_path / "writable-cache", 0o666)
  os.symlink(tmp_path / good, tmp_path / "link-cache")
  os.mkfifo(tmp_path / "fifo-cache")
  bad = {
    "truncated-cache": "does not decompress",
    "writable-cache": "is writable by its group",
    "link-cache": "is a link",
    "fifo-cache": "is not a regular file",
  }
  # Not JAX's (it reads only <key>-cache at the top level): left alone, e.g. a cache directory
  # that other tools' caches share.
  others = ["notes.txt", "deps/writable-cache", "deps/link"]
  (tmp_path / "deps").mkdir()
  for name in others[:2]:
    (tmp_path / name).write_bytes(b"not an entry")
    os.chmod(tmp_path / name, 0o666)
  os.symlink(tmp_path / "notes.txt", tmp_path / "deps" / "link")
  if os.getuid() == 0:
    (tmp_path / "foreign-cache").write_bytes(blob)
    os.chown(tmp_path / "foreign-cache", 1000, 1000)
    bad["foreign-cache"] = "is owned by uid 1000"
  with caplog.at_level("WARNING"):
    compile_cache.check_entries(str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == sorted([good, "deps", "notes.txt"])  # JAX's entry kept
  assert all(os.path.lexists(tmp_path / name) for name in others)
  lines = [r.getMessage() for r in caplog.records]
  for name, why in bad.items():
    (line,) = [m for m in lines if f"{tmp_path}/{name} " in m]
    assert why in line and line.endswith("; deleted it (compiled again)") and "\n" not in line


@pytest.mark.parametrize("loads", [True, False])
def test_zstd_entries_are_read_as_jax_reads_them(loads, tmp_path, monkeypatch, caplog):
  """On Python 3.14 JAX compresses with the standard library's `compression.zstd` (the
  zstandard package may be absent): an entry it wrote is kept, one that fails is deleted."""

  def decompress(blob):
    if not loads:
      raise ValueError("not a zstd frame")
    return blob[4:]

  zstd = types.SimpleNamespace(decompress=decompress)
  monkeypatch.setitem(sys.modules, "compression", types.SimpleNamespace(zstd=zstd))
  monkeypatch.setitem(sys.modules, "zstandard", None)  # not installed
  entry = tmp_path / "jit_f-0123-cache"
  entry.write_bytes(b"\x28\xb5\x2f\xfd" + b"frame")
  os.chmod(entry, 0o600)
  with caplog.at_level("WARNING"):
    compile_cache.check_entries(str(tmp_path))
  assert entry.exists() == loads
  assert ("does not decompress" in caplog.text) != loads


@pytest.mark.parametrize("setting", ["", "none", "cache"])
def test_rl_runs_use_the_run_cache_setting(setting, tmp_path, monkeypatch):
  """RL runs enable the cache as supervised runs do (before any compile)."""
  config = rl_tool_feedback.get_config("sd")
  config.train.compile_cache_dir = str(tmp_path / setting) if setting == "cache" else setting

  def enable(directory):
    raise StopIteration(directory)

  monkeypatch.setattr(compile_cache, "enable", enable)
  with pytest.raises(StopIteration) as e:
    rl_run.run(config, str(tmp_path / "w"), env=None, init=None)
  want = {"": str(tmp_path / "w" / "compile_cache"), "none": None, "cache": str(tmp_path / "cache")}
  assert e.value.value == want[setting]


def test_an_entry_never_serves_another_step_count(tmp_path):
  """The LR schedule's length is a constant of the compiled step, so JAX's key (the module)
  tells a 10-step run's program from a 20-step run's: two entries, and a warm process gets its
  own schedule back (the removed settings-keyed layer could serve one run another's, #23)."""
  from jax._src import compilation_cache as cc

  from composer_jax.optim import default_config, make_schedule
  from composer_jax.train import config as train_config

  def lr_at_5(steps):
    c = ml_collections.ConfigDict({"train": {"steps": steps}, "optim": default_config()})
    c.optim.warmup_steps = 2
    optim = train_config.optim_config(c)
    return jax.jit(lambda s: make_schedule(optim, optim.lr)(s))(5)

  saved = jax.config.jax_compilation_cache_dir
  cc.reset_cache()
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  try:
    cold = {steps: float(lr_at_5(steps)) for steps in (10, 20)}
    assert len([f for f in os.listdir(tmp_path) if f.endswith("-cache")]) == 2
    cc.reset_cache()  # as a new process: the entries are read from the directory
    warm = {steps: float(lr_at_5(steps)) for steps in (20, 10)}
  finally:
    cc.reset_cache()
    jax.config.update("jax_compilation_cache_dir", saved)
  assert len([f for f in os.listdir(tmp_path) if f.endswith("-cache")]) == 2
  assert warm == cold and cold[10] != cold[20]


def test_processes_of_one_run_share_a_new_directory(tmp_path, monkeypatch):
  """The processes of one run (launch/local.py, a pod) enable one new cache at once: one
  finds the directory made by another between its own checks, or an entry gone that another
  deleted. Neither is an error (CI once failed on the first: 'File exists')."""
  directory = str(tmp_path / "compile_cache")
  makedirs = os.makedirs

  def another_process_first(path, mode=0o777, exist_ok=False):
    makedirs(path, mode=0o700)  # the other process wins the race
    makedirs(path, mode=mode, exist_ok=exist_ok)

  monkeypatch.setattr(os, "makedirs", another_process_first)
  (tmp_path / "entries").mkdir()
  entry = tmp_path / "entries" / "jit_f-0123-cache"
  entry.write_bytes(b"not compressed")
  os.chmod(entry, 0o600)
  listdir = os.listdir

  def listed_then_deleted(path):
    names = listdir(path)
    if os.path.exists(entry):
      os.remove(entry)  # by the other process, after this one listed it
    return names

  monkeypatch.setattr(os, "listdir", listed_then_deleted)
  saved = {
    k: getattr(jax.config, k)
    for k in (
      "jax_compilation_cache_dir",
      "jax_persistent_cache_min_compile_time_secs",
      "jax_persistent_cache_min_entry_size_bytes",
    )
  }
  try:
    jax.config.update("jax_compilation_cache_dir", None)
    compile_cache.enable(directory)
    assert jax.config.jax_compilation_cache_dir == directory
    compile_cache.check_entries(str(tmp_path / "entries"))
  finally:
    for k, v in saved.items():
      jax.config.update(k, v)
  assert os.stat(directory).st_mode & 0o777 == 0o700
  assert not entry.exists()
