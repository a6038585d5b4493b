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


class _FakeWorker:
  """Stands in for a side's process: records starts and how many are alive at once."""

  alive, most_alive, starts = 0, 0, []

  def __init__(self, side, **_):
    self.side = side
    cls = type(self)
    cls.alive += 1
    cls.most_alive = max(cls.most_alive, cls.alive)
    cls.starts.append(side.name)

  def read(self):
    return {"health": {"started": len(type(self).starts)}}

  def step(self):
    return {"wall": 1.0, "cpu": 1.0}

  def close(self):
    type(self).alive -= 1


def _compare_with_fakes(monkeypatch, **kwargs) -> tuple[versus.Result, type]:
  fake = type("Fake", (_FakeWorker,), {"starts": []})
  monkeypatch.setattr(versus, "_Worker", fake)
  sides = [versus.Side("ours", "jax", "m:f"), versus.Side("peer", "torch", "m:g")]
  return versus.compare(sides, rounds=3, **kwargs), fake


def test_passes_keep_one_side_alive_at_a_time_and_alternate_the_first(monkeypatch):
  result, fake = _compare_with_fakes(monkeypatch, passes=2)
  assert fake.most_alive == 1 and fake.alive == 0
  assert fake.starts == ["ours", "peer", "peer", "ours"]
  assert [len(result.times[s]["cpu"]) for s in ("ours", "peer")] == [6, 6]
  assert result.health["ours"] == {"started": 4}  # the last pass's health
  # Without passes both sides' processes live through the interleaved rounds.
  result, fake = _compare_with_fakes(monkeypatch)
  assert fake.most_alive == 2 and fake.starts == ["ours", "peer"]
  assert [len(result.times[s]["cpu"]) for s in ("ours", "peer")] == [3, 3]
