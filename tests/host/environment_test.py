"""The environment as input: each variable JAX cannot run with is one line saying what to set."""

import os
import subprocess
import sys

import pytest

from composer_jax.host import environment

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.parametrize(
  "env, message",
  [
    ({"JAX_PLATFORMS": "cdua"}, "JAX_PLATFORMS='cdua' names 'cdua', not a JAX backend; valid:"),
    ({"JAX_PLATFORMS": "tpu"}, "JAX_PLATFORMS='tpu': no tpu runtime is installed here"),
    (
      {"XLA_FLAGS": "--xla_force_host_platform_device_count=0"},
      "--xla_force_host_platform_device_count=0 must be an integer >= 1",
    ),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=-2"}, "must be an integer >= 1"),
    ({"XLA_FLAGS": "--xla_no_such_flag_anywhere=1"}, "XLA has no flag --xla_no_such_flag_anywhere"),
    ({"XLA_FLAGS": "xla_dump_to=/tmp"}, "is not --name=value"),
    ({"JAX_ENABLE_X64": "1"}, "JAX_ENABLE_X64='1': this code runs in float32/bfloat16"),
    ({"JAX_ENABLE_X64": "True"}, "unset it (or set JAX_ENABLE_X64=0)"),
  ],
)
def test_bad_variable_is_one_line(env, message):
  if env.get("JAX_PLATFORMS") == "tpu" and environment._installed("libtpu"):
    pytest.skip("libtpu is installed here")
  with pytest.raises(environment.EnvironmentSettingError) as e:
    environment.check(env)
  assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
  "env",
  [
    {},
    {"JAX_PLATFORMS": "cpu"},
    {"JAX_PLATFORMS": "tpu,cpu"},  # a fallback that is present
    {"JAX_ENABLE_X64": "0"},
    {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"},
  ],
)
def test_usable_environment_passes(env):
  environment.check(env)


def test_trainer_with_an_unknown_xla_flag_says_so_instead_of_aborting(tmp_path):
  # XLA itself aborts the process (SIGABRT, a C++ stack trace) on an unknown flag.
  env = dict(os.environ, XLA_FLAGS="--xla_no_such_flag_anywhere=1")
  proc = subprocess.run(
    [sys.executable, "-m", "experiments.run", f"--workdir={tmp_path}"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: XLA_FLAGS entry '--xla_no_such_flag_anywhere=1'"), last
  assert not os.listdir(tmp_path)  # stopped before any work


def test_the_task_tools_stay_jax_free_so_jax_variables_cannot_touch_them():
  env = dict(
    os.environ,
    JAX_PLATFORMS="cdua",
    JAX_ENABLE_X64="1",
    XLA_FLAGS="--xla_force_host_platform_device_count=0 --xla_no_such_flag=1",
  )
  code = (
    "import sys\n"
    "from composer_jax.codetasks.synthesis import make_tasks\n"
    "from composer_jax.codetasks.sandbox import grade_patch\n"
    "from composer_jax.codetasks import task, workers\n"
    "print('jax' in sys.modules)\n"
  )
  proc = subprocess.run(
    [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
  )
  assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr[-2000:]
