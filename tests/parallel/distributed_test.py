"""Multi-process runs: where the process layout comes from (against hand-written expected
plans), and a 2-process x 4-device run through `launch/local.py` against 1 process x 8
devices (the pytest process)."""

import json
import os
import socket
import subprocess
import sys
import sysconfig

import jax
import numpy as np
import pytest

from composer_jax.model.config import get_preset, model_config
from composer_jax.parallel import distributed
from composer_jax.parallel.distributed import Plan, Settings
from composer_jax.train import checkpointing, placement, programs
from experiments.configs import default
from tests import local_launch

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

_SLURM = {
  "SLURM_JOB_ID": "77",
  "SLURM_STEP_NODELIST": "gpu[01-02]",
  "SLURM_NTASKS": "16",
  "SLURM_PROCID": "5",
  "SLURM_LOCALID": "5",
  "SLURM_STEP_NUM_NODES": "2",
  "SLURM_GPUS_ON_NODE": "8",
}


@pytest.mark.parametrize(
  "settings,environ,tpu_vm,expected",
  [
    (Settings(), {}, False, Plan("single", {})),
    (
      Settings(coordinator="10.0.0.1:1234", num_processes=2, process_id=1),
      {},
      False,
      Plan(
        "explicit",
        dict(
          coordinator_address="10.0.0.1:1234",
          num_processes=2,
          process_id=1,
          local_device_ids=None,
          cluster_detection_method="deactivate",
        ),
      ),
    ),
    # Explicit settings win over SLURM; --num_processes=1 alone over everything.
    (
      Settings(coordinator="h:1", num_processes=2, process_id=0, local_device_ids=(0, 1)),
      _SLURM,
      True,
      Plan(
        "explicit",
        dict(
          coordinator_address="h:1",
          num_processes=2,
          process_id=0,
          local_device_ids=(0, 1),
          cluster_detection_method="deactivate",
        ),
      ),
    ),
    (Settings(num_processes=1), _SLURM, True, Plan("single", {})),
    # One process per GPU: JAX reads the SLURM env and picks GPU SLURM_LOCALID itself.
    (Settings(), _SLURM, False, Plan("slurm", {})),
    # One process per node: it drives every GPU of its node.
    (
      Settings(),
      {**_SLURM, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0"},
      False,
      Plan("slurm", {"local_device_ids": tuple(range(8))}),
    ),
    (
      Settings(local_device_ids=(2, 3)),
      {**_SLURM, "SLURM_NTASKS": "2", "SLURM_PROCID": "1"},
      False,
      Plan("slurm", {"local_device_ids": (2, 3)}),
    ),
    # A one-task step, or SLURM outside srun (no step variables), is a single process.
    (Settings(), {**_SLURM, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, False, Plan("single", {})),
    (Settings(), {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4"}, False, Plan("single", {})),
    (Settings(), {}, True, Plan("tpu", {})),
  ],
)
def test_resolve(settings, environ, tpu_vm, expected):
  assert distributed.resolve(settings, environ, tpu_vm=tpu_vm) == expected


@pytest.mark.parametrize(
  "settings,environ,message",
  [
    (
      Settings(coordinator="h:1", num_processes=2, process_id=2),
      {},
      "--process_id=2 must be in [0, --num_processes=2)",
    ),
    (
      Settings(num_processes=2, process_id=0),
      {},
      "--coordinator missing (given: --num_processes=2, --process_id=0)",
    ),
    (Settings(coordinator="h:1"), {}, "--num_processes and --process_id missing"),
    (
      Settings(coordinator="localhost", num_processes=2, process_id=0),
      {},
      "--coordinator='localhost' must be HOST:PORT",
    ),
    (Settings(num_processes=0), {}, "--num_processes=0 must be >= 1"),
    (Settings(num_processes=1, process_id=1), {}, "--process_id=1 must be 0 with"),
    (Settings(local_device_ids=(0, 1)), {}, "--local_device_ids=0,1 applies to multi-process"),
    (
      Settings(coordinator="h:1", num_processes=2, process_id=0, local_device_ids=(1, 1)),
      {},
      "--local_device_ids=1,1 must be distinct",
    ),
    (
      Settings(),
      {**_SLURM, "SLURM_PROCID": "16"},
      "SLURM_PROCID=16 must be in [0, SLURM_NTASKS=16)",
    ),
    (Settings(), {**_SLURM, "SLURM_NTASKS": "x"}, "SLURM_NTASKS='x' is not an integer"),
  ],
)
def test_bad_settings_are_one_line_errors(settings, environ, message):
  with pytest.raises(ValueError, match=r"^[^\n]+$") as e:
    distributed.resolve(settings, environ, tpu_vm=False)
  assert message in str(e.value)


def test_parse_device_ids():
  assert distributed.parse_device_ids("0,2,3") == (0, 2, 3)
  assert distributed.parse_device_ids(None) is None
  with pytest.raises(ValueError, match="--local_device_ids='0,a' must be comma-separated"):
    distributed.parse_device_ids("0,a")


def test_tpu_vm_detection(tmp_path, monkeypatch):
  """A TPU VM: libtpu installed and a Google (vendor 0x1ae0) device on the PCI bus."""
  for name, vendor in (("0000:00:01.0", "0x8086"), ("0000:00:04.0", "0x1ae0")):
    (tmp_path / name).mkdir()
    (tmp_path / name / "vendor").write_text(vendor + "\n")
  monkeypatch.setattr(distributed.importlib.util, "find_spec", lambda name: None)
  assert not distributed.on_tpu_vm(str(tmp_path))
  monkeypatch.setattr(distributed.importlib.util, "find_spec", lambda name: object())
  assert distributed.on_tpu_vm(str(tmp_path))
  (tmp_path / "0000:00:04.0" / "vendor").write_text("0x10de\n")
  assert not distributed.on_tpu_vm(str(tmp_path))


def test_checkpoint_barriers_use_the_coordination_service(tmp_path):
  """2 processes x 4 devices save and restore through `Checkpointer`: orbax's barriers wait on
  JAX's coordination service, so no 2-rank gloo communicators are built (orbax's default
  barrier, a device all-gather, builds one per pair of same-index devices, 4 here, each
  connected under a fixed 30 s deadline); the restore's sum over all 8 devices builds the one
  8-rank communicator."""
  procs = local_launch.start_module(
    "tests.parallel.checkpoint_process", 2, 4, lambda coordinator, i: (coordinator, i, tmp_path)
  )
  outs = [p.communicate(timeout=300)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-5000:]
    assert "restored sum 120.0" in out, out[-5000:]
    assert "connected to 7 peer ranks" in out, out[-5000:]  # gloo reports its communicators
    assert "connected to 1 peer ranks" not in out, out[-5000:]


def test_multi_process_mesh_must_span_every_device(monkeypatch):
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  with pytest.raises(ValueError, match="use 1 of the 8 devices of this 2-process run"):
    placement.build_mesh(default.get_config().mesh, get_preset("tiny"))


# A few steps of the default config's model and optimizer, tiny batches, over all devices.
_OVERRIDES = {
  "train.steps": 3,
  "optim.warmup_steps": 1,
  "train.batch_size": 8,
  "train.seq_len": 32,
  "train.log_every": 1,
  "train.eval_every": 0,
  "train.eval_batches": 1,
  "data.paths": os.path.join(sysconfig.get_paths()["stdlib"], "asyncio"),
  "data.validation_fraction": 0.2,
}
_LAYOUT = "fsdp_ep"


def _config():
  c = default.get_config(_LAYOUT)
  for key, value in _OVERRIDES.items():
    section, field = key.split(".")
    c[section][field] = value
  return c


def _final_params(workdir, config):
  progs = programs.programs(config, model_config(config.model))
  ckpt = checkpointing.Checkpointer(workdir, keep=1)
  try:
    return jax.device_get(ckpt.restore(ckpt.latest_step(), progs.target).params)
  finally:
    ckpt.close()


def _launch(num_processes: int, devices_per_process: int, workdir: str) -> subprocess.Popen:
  return local_launch.launch(
    num_processes,
    devices_per_process,
    [
      f"--config=experiments/configs/default.py:{_LAYOUT}",
      f"--workdir={workdir}",
      *(f"--config.{k}={v}" for k, v in _OVERRIDES.items()),
    ],
  )


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
  """2 processes x 4 devices == 1 process x 8 devices (both through launch/local.py):
  per-step losses, and the final params in the processes' cooperative checkpoint."""
  multi, single = str(tmp_path / "multi"), str(tmp_path / "single")
  # One after the other: 3 processes at once on 2 cores cost more CPU time (busy-waiting
  # collectives) for no shorter wall time.
  local_launch.wait_ok([_launch(1, 8, single)], 1200)
  local_launch.wait_ok([_launch(2, 4, multi)], 1200)
  # The 1-process run compiled each step program once (its persistent cache holds one entry
  # each): the train step's outputs (its next inputs) come back with its first inputs'
  # shardings (`out_shardings`), so step 2 reuses step 1's program.
  cached = sorted(
    f.split("-")[0]
    for f in os.listdir(os.path.join(single, "compile_cache"))
    if f.startswith(("jit_train_step", "jit_eval_step"))
  )
  assert cached == ["jit_eval_step", "jit_train_step"], cached

  def losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [1, 2, 3]  # Written once, by process 0.
    return [r["loss"] for r in records]

  np.testing.assert_allclose(losses(multi), losses(single), rtol=1e-6)
  # Both processes wrote their shards and their data-iterator positions.
  step_dir = os.path.join(multi, "checkpoints", "3")
  assert sorted(os.listdir(os.path.join(step_dir, "data"))) == [
    "commit_success.txt",
    "process_0-of-2.json",
    "process_1-of-2.json",
  ]
  assert {"ocdbt.process_0", "ocdbt.process_1"} <= set(os.listdir(os.path.join(step_dir, "state")))
  config = _config()
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
    _final_params(multi, config),
    _final_params(single, config),
  )


def _one_line_errors(output: str) -> list[str]:
  return sorted(line for line in output.splitlines() if "error: " in line)


# Accepted with one process, refused with two: the error shows both processes joined one run.
_NEEDS_ONE_PROCESS = "--config.train.batch_size=3"
_TWO_PROCESS_ERROR = (
  "error: train.batch_size=3 must be divisible by train.grad_accum=1 x process count 2"
)


def test_local_launcher_joins_processes_and_propagates_failure():
  proc = subprocess.run(
    [
      sys.executable,
      "launch/local.py",
      "--num_processes=2",
      "--devices_per_process=1",
      "--",
      _NEEDS_ONE_PROCESS,
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert _one_line_errors(proc.stdout) == [f"[process {i}] {_TWO_PROCESS_ERROR}" for i in (0, 1)]
  assert "exited with 1" in proc.stderr, proc.stderr


_FAKE_SRUN = """#!/usr/bin/env bash
# srun stand-in: runs the command once per task on this machine with the SLURM step variables.
echo "$@" > "$(dirname "$0")/srun_args"
while [[ $1 == --* ]]; do [[ $1 == --ntasks=* ]] && n=${1#--ntasks=}; shift; done
for ((i = 0; i < n; i++)); do
  SLURM_JOB_ID=77 SLURM_STEP_NODELIST=localhost SLURM_STEP_NUM_NODES=1 SLURM_NTASKS=$n \
    SLURM_PROCID=$i SLURM_LOCALID=$i "$@" &
done
code=0; for ((i = 0; i < n; i++)); do wait -n || code=$?; done; exit $code
"""


def test_slurm_script_runs_one_process_per_gpu(tmp_path):
  """launch/slurm.sbatch under a stand-in srun: the processes find each other from the SLURM
  variables alone (JAX's SLURM detection, through `distributed.resolve`)."""
  srun = tmp_path / "srun"
  srun.write_text(_FAKE_SRUN)
  srun.chmod(0o755)
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and not k.startswith("SLURM")}
  env.update(
    PATH=f"{tmp_path}:{env['PATH']}",
    PYTHON=sys.executable,
    SLURM_SUBMIT_DIR=REPO,
    SLURM_JOB_NUM_NODES="1",
    SLURM_GPUS_ON_NODE="2",
    JAX_PLATFORMS="cpu",
    JAX_COORDINATOR_PORT=str(local_launch.free_port()),
  )
  script = os.path.join(REPO, "launch", "slurm.sbatch")  # Run from elsewhere: it cds itself.
  proc = subprocess.run(
    ["bash", script, _NEEDS_ONE_PROCESS],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert proc.stderr.count(_TWO_PROCESS_ERROR) == 2, proc.stderr  # Shared stderr: may interleave.
  assert (tmp_path / "srun_args").read_text().split() == [
    "--nodes=1",
    "--ntasks-per-node=2",
    "--ntasks=2",
    "--gpu-bind=none",
    "--kill-on-bad-exit=1",
    sys.executable,
    "-m",
    "experiments.run",
    _NEEDS_ONE_PROCESS,
  ]


def test_tpu_pod_script_commands(tmp_path):
  """launch/tpu_pod.sh under a stand-in gcloud: copy + install on every worker, then the run
  with its arguments quoted for the remote shell."""
  gcloud = tmp_path / "gcloud"
  gcloud.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$*" >> "$(dirname "$0")/calls"\n')
  gcloud.chmod(0o755)
  env = dict(os.environ, GCLOUD=str(gcloud), SETUP="1", REMOTE_DIR="cj")
  proc = subprocess.run(
    ["bash", "launch/tpu_pod.sh", "pod", "zone-a", "--config=a b.py", "--workdir=/mnt/w"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert proc.returncode == 0, proc.stderr
  scp, setup, run = (tmp_path / "calls").read_text().splitlines()
  assert scp.startswith("compute tpus tpu-vm scp ") and scp.endswith(
    " pod:composer_jax.tar.gz --zone=zone-a --worker=all"
  )
  assert setup.startswith("compute tpus tpu-vm ssh pod --zone=zone-a --worker=all --command=")
  assert "cd cj && tar xzf ~/composer_jax.tar.gz" in setup and ".[tpu]" in setup
  assert run == (
    "compute tpus tpu-vm ssh pod --zone=zone-a --worker=all --command=cd cj && "
    ".venv/bin/python -m experiments.run --config=a\\ b.py --workdir=/mnt/w "
  )


def test_unresolvable_coordinator_is_one_line_before_jax(monkeypatch):
  monkeypatch.setattr(jax.distributed, "initialize", lambda **_: pytest.fail("JAX was called"))
  s = Settings(coordinator="no-such-host.invalid:1234", num_processes=2, process_id=1)
  with pytest.raises(ValueError, match=r"host 'no-such-host.invalid' does not resolve"):
    distributed.initialize(s)


def test_coordinator_port_held_by_another_program_is_one_line_before_jax(monkeypatch):
  monkeypatch.setattr(jax.distributed, "initialize", lambda **_: pytest.fail("JAX was called"))
  with socket.socket(socket.AF_INET6) as holder:
    holder.bind(("::", 0))
    holder.listen()
    port = holder.getsockname()[1]
    s = Settings(coordinator=f"localhost:{port}", num_processes=2, process_id=0)
    with pytest.raises(ValueError, match=f"port {port} is in use by another program"):
      distributed.initialize(s)


_JOIN_ALONE = """
import sys
from composer_jax.parallel import distributed
distributed.initialize(distributed.Settings(
  coordinator=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]), timeout_s=1))
print("joined")
"""


@pytest.mark.parametrize("process_id", [0, 1])  # 0: its peer never comes; 1: nor process 0
def test_start_up_without_peers_stops_at_the_deadline_with_one_line(process_id):
  coordinator = f"localhost:{local_launch.free_port()}"
  proc = subprocess.run(
    [sys.executable, "-c", _JOIN_ALONE, coordinator, str(process_id)],
    capture_output=True,
    text=True,
    timeout=60,  # the deadline is 1 s: a hang fails here, not in CI's timeout
  )
  assert proc.returncode == 1, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: multi-process start-up: process {process_id} of 2"), last
  assert "within 1 s (--init_timeout_s=1)" in last and "Check failure" not in proc.stderr
