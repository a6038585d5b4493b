"""The notebooks under experiments/notebooks execute headless at smoke size (CPU runtime)."""

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


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs_at_smoke_size(name):
  nb = nbformat.read(os.path.join(REPO, "experiments", "notebooks", name), as_version=4)
  params = nb.cells[1]
  assert params.source.startswith("SMOKE = False")
  params.source = params.source.replace("SMOKE = False", "SMOKE = True", 1)
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
