"""The comparison harness refuses a ratio against an unhealthy side and says why."""

from experiments.bench import versus


def _result(peer_matmul: float, peer_small: float) -> versus.Result:
  health = {
    "ours": {
      "matmul_flops_cpu": 100e9,
      "matmul_flops_wall": 100e9,
      "small_op_s_cpu": 50e-6,
      "small_op_s_wall": 50e-6,
    },
    "peer": {
      "matmul_flops_cpu": peer_matmul,
      "matmul_flops_wall": peer_matmul,
      "small_op_s_cpu": peer_small,
      "small_op_s_wall": peer_small,
    },
  }
  times = {
    "ours": {"wall": [1.0, 2.0, 1.0], "cpu": [1.0, 1.0, 1.2]},
    "peer": {"wall": [3.0, 3.0, 9.0], "cpu": [2.0, 2.2, 2.0]},
  }
  return versus.Result(
    device="cpu",
    clock="cpu",
    threads=1,
    health=health,
    times=times,
    loads=[1.0, 1.0, 1.0],
    flops_per_call=50e9,
    items_per_call=1000,
    item="tokens",
  )


def test_healthy_sides_give_the_median_ratio_and_mfu(capsys):
  ratio = versus.report(_result(160e9, 70e-6), "ratio_x", ours="ours")
  assert ratio == 2.0  # medians on the CPU clock: 2.0 / 1.0
  out = capsys.readouterr().out
  assert "ratio_x=2.00" in out and "wall clock: 3.00" in out
  assert "MFU  31.2%" in out  # 50 GFLOP / 1.0 s / best matmul 160 GFLOP/s


def test_a_crippled_peer_gets_no_ratio_and_the_reason(capsys):
  r = _result(30e9, 3e-3)  # a fifth of our matmul rate, 60x our small-op cost
  assert versus.report(r, "ratio_x", ours="ours") is None
  out = capsys.readouterr().out
  assert "ratio_x=" not in out and "no ratio_x" in out
  assert "peer: large matmul 30.0 GFLOP/s is below 0.5 x the best side's 100.0" in out
  assert "peer: small op 3000 us is over 10 x ours's 50 us" in out
  assert r.unhealthy() and not _result(160e9, 70e-6).unhealthy()
