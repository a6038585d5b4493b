"""The notebooks under experiments/notebooks execute headless at smoke size (CPU runtime), set
as papermill sets it; their install cell picks the extras by the accelerator the runtime has."""

import configparser
import os

import nbformat
import pytest
from nbclient import NotebookClient

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# notebook -> lines its outputs must hold
NOTEBOOKS = {
  "ablate_optimizer.ipynb": ("muon: final validation loss", "adamw: final validation loss"),
  "ablate_text_feedback.ipynb": (
    "warm-up: final cross-entropy",
    "rl: last step unavailable",
    "sd: last step unavailable",
  ),
}


def _read(name):
  return nbformat.read(os.path.join(REPO, "experiments", "notebooks", name), as_version=4)


def _runtime_extra(name):
  """The install cell's `runtime_extra` (the cell up to where it installs)."""
  (cell,) = [c for c in _read(name).cells if "def runtime_extra" in c.source]
  scope = {}
  exec(cell.source.split("EXTRA = runtime_extra()")[0], scope)
  return cell.source, scope["runtime_extra"]


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_install_cell_detects_accelerators_by_what_they_are(name, tmp_path, monkeypatch):
  source, runtime_extra = _runtime_extra(name)
  for k in ("COLAB_TPU_ADDR", "TPU_NAME", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES"):
    monkeypatch.delenv(k, raising=False)
  monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
  dev, pci = tmp_path / "dev", tmp_path / "pci"
  (dev / "vfio").mkdir(parents=True)  # any VFIO passthrough machine: not a TPU
  (pci / "0000:00:04.0").mkdir(parents=True)
  (pci / "0000:00:04.0" / "vendor").write_text("0x8086\n")
  assert runtime_extra(str(dev), str(pci)) == ""
  (pci / "0000:00:05.0").mkdir()
  (pci / "0000:00:05.0" / "vendor").write_text("0x1ae0\n")  # a TPU v5e/v6e chip
  assert runtime_extra(str(dev), str(pci)) == "tpu"
  assert runtime_extra(str(dev), str(tmp_path / "none")) == ""
  (dev / "accel0").write_text("")  # a TPU v4 VM's chip
  assert runtime_extra(str(dev), str(tmp_path / "none")) == "tpu"
  (dev / "nvidia0").write_text("")
  assert runtime_extra(str(dev), str(pci)) == "cuda"
  monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
  assert runtime_extra(str(tmp_path / "empty"), str(tmp_path / "none")) == "tpu"
  # It installs the `notebooks` extra, which setup.cfg defines.
  assert 'EXTRAS = ",".join(["notebooks", *([EXTRA] if EXTRA else [])])' in source
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(REPO, "setup.cfg"))
  assert "papermill" in cfg["options.extras_require"]["notebooks"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs_at_smoke_size(name):
  nb = _read(name)
  # As `papermill -p SMOKE True` does: a cell setting it, right after the `parameters` cell.
  (at,) = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
  assert nb.cells[at].source.startswith("SMOKE = False")
  injected = nbformat.v4.new_code_cell("SMOKE = True", metadata={"tags": ["injected-parameters"]})
  nb.cells.insert(at + 1, injected)
  NotebookClient(
    nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": REPO}}
  ).execute()
  outputs = "".join(
    o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
  )
  # The install cell detects the runtime (CPU here) and skips the install (already importable).
  for line in ("runtime: cpu", "devices: [CpuDevice", *NOTEBOOKS[name]):
    assert line in outputs, (line, outputs[-2000:])
  assert any(
    "image/png" in o.get("data", {})
    for c in nb.cells
    if c.cell_type == "code"
    for o in c.get("outputs", [])
  )
