"""Metric files are never written through a symbolic link."""

import os

import pytest

from composer_jax.train import metrics


@pytest.mark.parametrize("name", ["metrics.jsonl", "metrics.jsonl.tmp", "metrics.jsonl.rerun"])
def test_metric_files_that_are_links_are_refused(tmp_path, name):
  target = tmp_path / "elsewhere.txt"
  target.write_text("precious\n")
  workdir = tmp_path / "w"
  workdir.mkdir()
  if name != "metrics.jsonl":  # a resumed run's files: one record after the resumed step
    (workdir / "metrics.jsonl").write_text('{"step": 1}\n{"step": 5}\n')
  os.symlink(target, workdir / name)
  with pytest.raises(OSError, match=f"{name} is a symbolic link .*refusing to write"):
    metrics.MetricsWriter(str(workdir), total_steps=10, start_step=1)
  assert target.read_text() == "precious\n"
