"""experiments/notebooks/ablate_optimizer.ipynb executes headless at smoke size."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NOTEBOOK = os.path.join(REPO, "experiments", "notebooks", "ablate_optimizer.ipynb")


@pytest.mark.slow
def test_notebook_runs_at_smoke_size():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  params = nb.cells[1]
  assert params.source.startswith("SMOKE = False")
  params.source = params.source.replace("SMOKE = False", "SMOKE = True", 1)
  NotebookClient(nb, timeout=900, kernel_name="python3",
                 resources={"metadata": {"path": REPO}}).execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
  assert "muon: final validation loss" in outputs and "adamw: final validation loss" in outputs
  assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
             for o in c.get("outputs", []))
