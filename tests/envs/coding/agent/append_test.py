"""The tiny-model coding format: the `append` tool, deletion tasks' oracle as `append` calls,
the compact statement, and oracle episodes as supervised examples (no sandbox needed)."""

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from composer_jax import chat
from composer_jax.codetasks import project
from composer_jax.codetasks import task as task_lib
from composer_jax.codetasks.sandbox import grader
from composer_jax.data import tokenizer as tok_lib
from composer_jax.envs.coding.agent import env as agent_env
from composer_jax.envs.coding.agent import scripts as agent_scripts
from composer_jax.envs.coding.agent import tools as agent_tools

BEFORE = {
  "pkg/__init__.py": "from .m import a\n",
  "pkg/m.py": 'def a(x):\n    """Return x."""\n    return x\n',
  "tests/test_m.py": "from pkg import a, b\n\n\ndef test_b():\n    assert b(2) == 5\n",
}
AFTER = {
  **BEFORE,
  "pkg/__init__.py": "from .m import a, b\n",
  "pkg/m.py": BEFORE["pkg/m.py"] + '\n\ndef b(x):\n    """Return x times 2 plus 1."""\n'
  "    return x * 2 + 1\n",
}
STATEMENT = (
  "The project `pkg` is missing a feature.\n\n```python\n# function b in pkg/m.py\n"
  'def b(x):\n    """Return x times 2 plus 1."""\n    ...\n```\n\nHidden tests: t\n'
)


def deletion_task(name="pkg-t1") -> task_lib.Task:
  with tempfile.TemporaryDirectory() as tmp:
    for rel, text in BEFORE.items():
      (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
      (Path(tmp) / rel).write_text(text)
    workspace = project.pack(Path(tmp), sorted(BEFORE))
    hidden = project.pack(Path(tmp), ["tests/test_m.py"])
  return task_lib.Task(
    id=name,
    source={"name": "pkg"},
    features=[],
    problem_statement=STATEMENT,
    deletion_diff="",
    gold_patch=task_lib.unified_diff(BEFORE, AFTER),
    workspace=workspace,
    hidden_files=hidden,
    FAIL_TO_PASS=["tests/test_m.py::test_b"],
    PASS_TO_PASS=[],
    provenance={},
  )


@pytest.fixture
def byte_tok(tmp_path):
  return tok_lib.load_tokenizer({"tokenizer": tok_lib.write_byte_ranks(str(tmp_path / "b"))})


def test_append_calls_restore_the_gold_files():
  """Applying the oracle's `append` calls gives code that behaves like the gold patch."""
  task = deletion_task()
  calls = agent_scripts.append_calls(task)
  assert [(n, json.loads(a)["path"]) for n, a in calls] == [
    ("append", "pkg/m.py"),
    ("append", "pkg/__init__.py"),
  ]
  assert "Return x times" not in calls[0][1]  # the docstring is in the statement already
  s = agent_tools.Session(task, tools=("append", "submit"))
  for name, args in calls:
    assert s.call(name, args).error == ""
  namespace = {}
  exec(s.files["pkg/m.py"].decode(), namespace)  # code this test wrote
  assert namespace["b"](2) == 5 and namespace["a"](3) == 3
  assert s.files["pkg/__init__.py"].decode().splitlines() == [
    "from .m import a",
    "",
    "",
    "from .m import b",
  ]
  assert "+def b(x):" in s.diff()


def test_append_errors_are_observations():
  s = agent_tools.Session(deletion_task(), tools=("append", "submit"))
  assert s.call("append", '{"path": "nope.py", "code": "x"}').error == "not_found"
  assert s.call("append", '{"path": "/etc/passwd", "code": "x"}').error == "outside"
  assert s.call("append", '{"path": "pkg/m.py"}').error == "bad_arguments"
  assert [e["type"] for e in s.events] == ["write", "write"]


def test_append_calls_reject_a_bug_fix():
  task = deletion_task()
  fix = task_lib.unified_diff(
    BEFORE, {**BEFORE, "pkg/m.py": BEFORE["pkg/m.py"].replace("return x\n", "return -x\n")}
  )
  with pytest.raises(ValueError, match="changes more than an added function"):
    agent_scripts.append_calls(task_lib.Task(**{**task.__dict__, "gold_patch": fix}))


@pytest.mark.parametrize("thinking", [False, True])
def test_oracle_trajectory_is_the_env_transcript(byte_tok, thinking):
  """The supervised example: the env's own tokens (compact statement, K2.5 pre-fill), the
  policy's turns trainable, the harness's observation not."""
  task = deletion_task()
  env = agent_env.CodingEnv(
    [task],
    byte_tok,
    tools=("append", "submit"),
    thinking=thinking,
    statement="compact",
    max_turn_tokens=200,
    budget=agent_tools.Budget(max_turns=3, max_tokens=1200),
  )
  traj = agent_scripts.oracle_trajectory(env, task)
  text = byte_tok.decode(traj.tokens)
  assert "missing a feature" not in text and "# function b in pkg/m.py" in text
  prefill = "<think>" if thinking else "<think></think>"
  assert text.count("<|im_assistant|>assistant<|im_middle|>" + prefill) == 2
  written = byte_tok.decode(traj.tokens[traj.model_mask])
  assert "appended to pkg/m.py" in text and "appended to" not in written
  assert written.count("functions.append:") == 2 and "functions.submit:" in written
  # Each model turn parses (after the pre-fill) into the oracle's calls.
  turns = [np.flatnonzero((traj.turn_ids == k) & traj.model_mask) for k in (1, 3)]
  first = env.prefill + byte_tok.decode(traj.tokens[turns[0]])
  calls = agent_scripts.append_calls(task)
  parsed = chat.parse_assistant(first)
  assert parsed.error is None and [(c.name, c.arguments) for c in parsed.tool_calls] == calls


def test_unknown_statement_is_one_clear_error(byte_tok):
  with pytest.raises(ValueError, match="statement='short'"):
    agent_env.CodingEnv([deletion_task()], byte_tok, statement="short")


def test_gold_patch_of_the_fixture_applies():
  with tempfile.TemporaryDirectory() as tmp:
    project.unpack(deletion_task().workspace, Path(tmp))
    assert not grader.apply_patch(Path(tmp), deletion_task().gold_patch)
    assert (Path(tmp) / "pkg/m.py").read_text() == AFTER["pkg/m.py"]
