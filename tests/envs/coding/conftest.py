"""The agent's and evaluation's tests share the coding-task fixtures (tests/codetasks)."""

from tests.codetasks.conftest import hypot_task, mini_gen, mini_root  # noqa: F401 (fixtures)
