"""Smoke test of the optimizer-step cost figure: CSVs checked against hand computations."""

import csv
import os
import subprocess
import sys


def _rows(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def test_figure_numbers_match_hand_computation(tmp_path):
  subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.figures.optimizer_step_cost",
      f"--out={tmp_path}",
      "--devices=384,768",
      "--bytes_per_elem=2",
    ],
    check=True,
    cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
    timeout=600,
  )
  assert (tmp_path / "optimizer_step_cost.png").stat().st_size > 10_000

  # One Kimi-K2 routed-expert gate matrix [7168, 2048]: m = 2048 (small side), n = 7168,
  # 5 steps of 4 m^2 n + 2 m^3 = 5 * (120_259_084_288 + 17_179_869_184).
  per_matrix = 5 * (4 * 2048**2 * 7168 + 2 * 2048**3)
  assert per_matrix == 687_194_767_360
  mats = {r["path"]: r for r in _rows(tmp_path / "matrices.csv")}
  gate = mats["['moe_layers']['moe']['experts']['gate']"]
  assert (int(gate["count"]), int(gate["fan_in"]), int(gate["fan_out"])) == (60 * 384, 7168, 2048)
  assert int(gate["ns_flops_per_matrix"]) == per_matrix

  steps = {int(r["devices"]): r for r in _rows(tmp_path / "step_cost.csv")}
  # 384 GPUs = EP 384: whole expert matrices, no all-to-all; gate+up (46080 [7168, 2048])
  # and down (23040 [2048, 7168]) spread over 384 GPUs: 120 + 60 matrices on each.
  assert float(steps[384]["expert_flops_per_device"]) == 180 * per_matrix
  assert float(steps[384]["expert_a2a_bytes_per_device"]) == 0
  # 768 GPUs = EP 384 x 2-way FSDP per expert: each GPU holds half of 69120/768 = 90
  # matrices' worth of blocks, sends 1/2 of them and receives back: 2 * 1/2 * 90 * m*n*2 B.
  assert float(steps[768]["expert_a2a_bytes_per_device"]) == 2 * 0.5 * 90 * 7168 * 2048 * 2

  lay = {r["layout"]: r for r in _rows(tmp_path / "layouts.csv")}
  assert (int(lay["cp2_ep8"]["dual_view_devices"]), int(lay["cp2_ep8"]["shared_mesh_devices"])) == (
    8,
    16,
  )
  assert int(lay["fsdp_ep"]["shared_mesh_devices"]) == 8
