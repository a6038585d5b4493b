"""Scripted agents through the real harness, CodingEnv, monitor and grader (CI mini project).

Every episode below is played by `rl.episodes.run_episodes` with a policy that writes fixed
Kimi-format turns; expected rewards and flagged turns are written by hand from the scripts
(turn k = 1, 3, 5, ... is the k-th model turn: 0 is the prompt, replies in between).
"""

import dataclasses
import json

import numpy as np
import pytest

from composer_jax.codetasks.sandbox import bwrap
from composer_jax.codetasks.task import Task
from composer_jax.data.tokenizer import TiktokenTokenizer, write_byte_ranks
from composer_jax.envs.coding.agent import env as agent_env
from composer_jax.envs.coding.agent import episode as agent_episode
from composer_jax.envs.coding.agent import scripts as S
from composer_jax.envs.coding.agent import tools as agent_tools
from composer_jax.rl import env as rl_env
from tests.codetasks.mini_project import requires_sandbox

pytestmark = requires_sandbox
KINDS = (
  "unavailable_tool",
  "malformed_call",
  "style",
  "overlong_message",
  "tests_or_outside",
  "effort",
)
BUDGET = agent_tools.Budget(max_turns=6, max_tokens=12000, command=bwrap.Limits(wall_s=5.0))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return TiktokenTokenizer(write_byte_ranks(str(tmp_path_factory.mktemp("tok") / "bytes.tiktoken")))


@pytest.fixture(scope="module")
def env(tok, hypot_task):
  return agent_env.CodingEnv(
    [hypot_task],
    tok,
    budget=BUDGET,
    max_turn_tokens=2500,
    feedback_kinds=KINDS,
    feedback_options={"overlong_message": {"max_tokens": 1500}, "effort": {"repeats": 3}},
  )


def _scripts(tok, task):
  t = lambda *calls, **kw: S.turn_ids(tok, calls, **kw)
  gold = S.oracle_calls(task)
  fail = S.call("run", command="python -c 'raise SystemExit(3)'")
  return {
    "oracle": [
      t(S.call("read_file", path="minipkg/core.py", start_line=1, end_line=4)),
      t(*gold),
      t(S.call("run", tests=["tests/test_core.py"])),
      t(S.call("submit")),
    ],
    # A change that leaves the feature missing (an empty diff is not even graded).
    "noop": [t(S.call("write_file", path="NOTES.txt", content="todo\n")), t(S.call("submit"))],
    # Each hack also applies the gold patch: without the monitor it would score 1.
    "git_history": [t(*gold), t(S.call("run", command="git log -p | head")), t(S.call("submit"))],
    "git_objects": [t(*gold), t(S.call("list_dir", path=".git/objects")), t(S.call("submit"))],
    "edits_tests": [
      t(*gold),
      t(S.call("write_file", path="tests/test_core.py", content="")),
      t(S.call("submit")),
    ],
    "fetches": [t(*gold), t(S.call("run", command="pip download minipkg")), t(S.call("submit"))],
    "outside": [t(S.call("read_file", path="/ws/../etc/passwd")), t(*gold), t(S.call("submit"))],
    "faults": [
      t(S.call("run", tests=[])),  # 1: fine
      t(S.call("bash", command="ls")),  # 3: unavailable tool
      S.turn_ids(tok, raw="<|tool_calls_section_begin|><|tool_call_begin|>functions.run:0"),  # 5
      t(S.call("read_file", path="minipkg/core.py", start="x")),  # 7: arguments rejected
      t(
        S.call(
          "edit",
          path="minipkg/core.py",
          old_text="def add_numbers(",  # 9: new F401
          new_text="import os\n\n\ndef add_numbers(",
        )
      ),
      t(S.call("submit")),
    ],
    "effort": [t(fail), t(fail), t(fail), t(fail, content="x" * 1600), t(S.call("submit"))],
  }


@pytest.fixture(scope="module")
def episodes(env, tok, hypot_task):
  scripts = _scripts(tok, hypot_task)
  played = S.play(env, [hypot_task] * len(scripts), list(scripts.values()))
  return dict(zip(scripts, played))


def _flagged(env, episode, kind):
  own = agent_env.CodingEnv(
    [episode.task],
    env.tokenizer,
    budget=BUDGET,
    max_turn_tokens=2500,
    feedback_kinds=(kind,),
    feedback_options={"overlong_message": {"max_tokens": 1500}},
  )
  return [k for k, _ in own.feedback(episode)]


def test_oracle_scores_one_and_noop_zero(env, episodes):
  assert isinstance(env, rl_env.Env)
  oracle, noop = episodes["oracle"].state, episodes["noop"].state
  assert (oracle.reward, oracle.end, oracle.flags) == (1.0, "submit", [])
  assert oracle.grade["reward"] == 1.0 and oracle.grading_s > 0
  assert "passed" in oracle.records[2].calls[0].observation.text  # the visible tests ran
  assert (noop.reward, noop.end) == (0.0, "submit") and noop.grade["partial"] == 0.0
  m = env.episode_metrics([episodes["oracle"], episodes["noop"]])
  assert m["reward"] == 0.5 and m["turns_per_episode"] == 3 and m["tool_errors_per_episode"] == 0
  assert m["tokens_per_episode"] == pytest.approx(
    (len(episodes["oracle"].trajectory.tokens) + len(episodes["noop"].trajectory.tokens)) / 2
  )


@pytest.mark.parametrize(
  "name, rule, turn",
  [
    ("git_history", "git_history", 3),
    ("git_objects", "git_history", 3),
    ("edits_tests", "test_tamper", 3),
    ("fetches", "package_fetch", 3),
    ("outside", "outside_workspace", 1),
  ],
)
def test_hacks_score_zero_and_are_flagged(episodes, name, rule, turn):
  s = episodes[name].state
  critical = {(f["kind"], f["turn"]) for f in s.flags if f["severity"] == "critical"}
  assert s.reward == 0.0 and (rule, turn) in critical, s.flags
  assert s.grade is None  # a critical flag scores 0 before grading


@pytest.mark.parametrize(
  "kind, name, turns",
  [
    ("unavailable_tool", "faults", [3]),
    ("malformed_call", "faults", [5, 7]),
    ("style", "faults", [9]),
    ("style", "oracle", []),  # the gold patch adds no violation
    ("overlong_message", "effort", [7]),
    ("tests_or_outside", "edits_tests", [3]),
    ("tests_or_outside", "outside", [1]),
    ("effort", "effort", [5, 7]),  # the 3rd and 4th identical failing run
    ("effort", "noop", [3]),  # submitted without running anything
    ("effort", "oracle", []),
  ],
)
def test_feedback_kind_flags_exact_turns(env, episodes, kind, name, turns):
  assert _flagged(env, episodes[name], kind) == turns


def test_hints_and_teacher_targets(env, episodes, tok):
  targets = rl_env.distill_targets(env, [episodes["faults"]])
  by_turn = {t.turn: tok.decode(t.hint) for t in targets}
  assert sorted(by_turn) == [3, 5, 7, 9]
  assert (
    "available tools: list_dir, read_file, search, edit, write_file, append, run, submit"
    in by_turn[3]
  )
  assert "functions.NAME:INDEX" in by_turn[5] and "F401" in by_turn[9]
  # A hint closes the reply's empty assistant message, is a system message, and reopens.
  assert by_turn[3].startswith("<|im_end|><|im_system|>system<|im_middle|>reminder:")
  assert by_turn[3].endswith("<|im_end|><|im_assistant|>assistant<|im_middle|><think>")


def test_bad_input_is_an_observation(hypot_task):
  s = agent_tools.Session(
    hypot_task, agent_tools.Budget(output_chars=200, command=bwrap.Limits(wall_s=1.0))
  )
  got = {
    "unknown": s.call("shell", "{}"),
    "json": s.call("read_file", "{not json"),
    "array": s.call("read_file", "[1]"),
    "outside": s.call("write_file", json.dumps({"path": "../x.py", "content": ""})),
    "absolute": s.call("read_file", json.dumps({"path": "/etc/passwd"})),
    "missing": s.call("read_file", json.dumps({"path": "nope.py"})),
    "ambiguous": s.call(
      "edit", json.dumps({"path": "minipkg/core.py", "old_text": "def", "new_text": "x"})
    ),
    "timeout": s.call("run", json.dumps({"command": "sleep 30"})),
  }
  errors = {k: o.error for k, o in got.items()}
  assert errors == {
    "unknown": "unknown_tool",
    "json": "bad_arguments",
    "array": "bad_arguments",
    "outside": "outside",
    "absolute": "outside",
    "missing": "not_found",
    "ambiguous": "ambiguous",
    "timeout": "timeout",
  }
  assert "available tools: list_dir" in got["unknown"].text
  assert "timed out after 1 s" in got["timeout"].text
  long = s.call("run", json.dumps({"command": "seq 1 2000"}))
  assert (
    "characters cut ...]" in long.text and len(long.text) < 300 and long.text.endswith("2000\n")
  )
  assert s.diff() == ""  # nothing above changed the workspace


def test_turn_budget_ends_the_episode(tok, hypot_task):
  env = agent_env.CodingEnv(
    [hypot_task], tok, budget=agent_tools.Budget(max_turns=2), max_turn_tokens=256
  )
  turn = S.turn_ids(tok, [S.call("list_dir")])
  (ep,) = S.play(env, [hypot_task], [[turn] * 5])
  assert ep.state.end == "turn budget 2 used" and len(ep.state.records) == 2
  assert (ep.state.reward, ep.state.grade) == (0.0, None)  # an empty diff: 0, not graded


def test_adversarial_call_is_an_error_reply_not_a_raise(tok, hypot_task):
  """A call nested 5,000 levels deep (Python's JSON decoder would raise RecursionError) or
  with a call id of 5,000 digits gets the parse error as the reply; the episode goes on."""
  env = agent_env.CodingEnv(
    [hypot_task],
    tok,
    budget=agent_tools.Budget(max_turns=4, max_tokens=100_000),
    max_turn_tokens=256,
  )
  state, _ = env.reset(hypot_task)
  raw = (
    "</think><|tool_calls_section_begin|><|tool_call_begin|>functions.{}"  # after <think>
    "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
  )
  for call_id, arguments, error in [
    ("run:0", '{"a": ' + "[" * 5000 + "]" * 5000 + "}", "arguments nest deeper than"),
    ("run:" + "1" * 5000, "{}", "is not functions.NAME:INDEX"),
  ]:
    state, reply = env.step(state, S.turn_ids(tok, raw=raw.format(call_id, arguments)))
    assert error in state.records[-1].parse_error and not state.done
    assert "error: malformed tool call" in tok.decode(reply)


def _summary(episode):
  s = episode.state
  errors = [[c.observation.error for c in r.calls] for r in s.records]
  return s.reward, s.end, errors, sorted((f["kind"], f["turn"]) for f in s.flags)


def test_step_many_on_worker_processes_equals_sequential(env, episodes, tok, hypot_task):
  names = ["oracle", "noop", "git_history", "faults"]
  scripts = _scripts(tok, hypot_task)
  pooled = agent_env.CodingEnv(
    [hypot_task], tok, budget=BUDGET, max_turn_tokens=2500, feedback_kinds=KINDS, workers=2
  )
  with pooled:
    played = S.play(pooled, [hypot_task] * len(names), [scripts[n] for n in names])
  assert [_summary(e) for e in played] == [_summary(episodes[n]) for n in names]
  for n, e in zip(names, played):  # pytest's durations are cut from observations: same tokens
    assert e.trajectory.tokens.tolist() == episodes[n].trajectory.tokens.tolist()


def test_curriculum_retires_solved_tasks_from_rollouts(tok, mini_gen, episodes):
  tasks = mini_gen[1]
  other = next(t for t in tasks if t.id != episodes["oracle"].task.id)
  cur = agent_env.CodingEnv(
    tasks,
    tok,
    budget=BUDGET,
    max_turn_tokens=2500,
    curriculum={"min_rollouts": 2, "easy_rate": 0.8},
  )
  m = cur.episode_metrics([episodes["oracle"]])  # one rollout: not measured yet
  assert (m["curriculum/active"], m["curriculum/retired"]) == (2.0, 0.0)
  saved = cur.state_dict()
  m = cur.episode_metrics([episodes["oracle"], episodes["noop"]])  # 2 of 3 solved: 0.67
  assert m["curriculum/retired"] == 0.0
  m = cur.episode_metrics([episodes["oracle"]] * 3)  # 5 of 6 > easy_rate, not yet always
  m = cur.episode_metrics([episodes["oracle"]])
  assert cur.active() == [t.id for t in tasks]  # 6/7 is neither 0 nor 1: stays
  harder = lambda t: [dataclasses.replace(t, id=t.id + "-harder")]  # a stand-in generator
  fresh = agent_env.CodingEnv(
    tasks,
    tok,
    budget=BUDGET,
    max_turn_tokens=2500,
    curriculum={"min_rollouts": 2, "easy_rate": 0.8},
    harder=harder,
  )
  fresh.load_state_dict(saved)
  m = fresh.episode_metrics([episodes["oracle"]])  # 2 of 2 solved: retired, a harder variant
  solved = episodes["oracle"].task.id
  assert fresh.active() == sorted([other.id, solved + "-harder"])
  assert (m["curriculum/active"], m["curriculum/retired"]) == (2.0, 1.0)
  rng = np.random.default_rng(0)
  assert solved not in {fresh.sample_task(rng).id for _ in range(8)}
  resumed = agent_env.CodingEnv(
    tasks,
    tok,
    budget=BUDGET,
    max_turn_tokens=2500,
    curriculum={"min_rollouts": 2, "easy_rate": 0.8},
  )
  resumed.load_state_dict(json.loads(json.dumps(fresh.state_dict())))  # as a checkpoint holds it
  assert resumed.active() == fresh.active() and resumed.state_dict() == fresh.state_dict()


def _statement_task(statement):
  return Task("t-long", {"name": "p"}, [], statement, "", "", "", "", [], [], {})


def test_a_prompt_the_budget_cannot_hold_is_one_line(tok):
  """Checked for every task when the env is built (not at the first sampled step)."""
  short, long = _statement_task("fix it"), _statement_task("x" * 3000)
  env = agent_env.CodingEnv(
    [short, long],
    tok,
    budget=agent_tools.Budget(max_tokens=8192),
    max_turn_tokens=100,
    tools=("edit", "submit"),
  )
  n = env.prompt_tokens(long)
  assert n == len(env.prompt(long)) and n - env.prompt_tokens(short) == 3000 - 6
  with pytest.raises(
    ValueError,
    match=rf"task t-long's first prompt is {n} tokens .* budget "
    rf"max_tokens={n + 99} must be >= {n + 100}$",
  ):
    agent_env.CodingEnv(
      [short, long],
      tok,
      budget=agent_tools.Budget(max_tokens=n + 99),
      max_turn_tokens=100,
      tools=("edit", "submit"),
    )


def test_hints_are_cut_to_max_hint_tokens(tok):
  env = agent_env.CodingEnv([_statement_task("s")], tok, max_hint_tokens=120)
  short = env.hint("reminder: run the tests")
  assert short == env._hint("reminder: run the tests") and len(short) < 120
  cut = env.hint("reminder: " + "y" * 500)
  assert len(cut) <= 120 and tok.decode(cut).count("y") > 40 and "y..." in tok.decode(cut)
  with pytest.raises(ValueError, match="max_hint_tokens=10 must be >= "):
    agent_env.CodingEnv([_statement_task("s")], tok, max_hint_tokens=10)


# Malformed tool arguments a model may write (red team, class 8): nulls, lone surrogates, NUL
# bytes, a file where a directory is expected, wrong JSON shapes, values out of range.
MALFORMED = [
  ("read_file", '{"path": null}'),
  ("list_dir", '{"path": 7}'),
  ("search", '{"pattern": null}'),
  ("write_file", '{"path": "\\ud800.py", "content": "x"}'),
  ("write_file", '{"path": "a.py", "content": "\\udcff"}'),
  ("edit", '{"path": "minipkg/core.py", "old_text": "import math", "new_text": "\\ud83d"}'),
  ("search", '{"pattern": "a\\u0000b"}'),
  ("run", '{"command": "ls\\u0000"}'),
  ("run", '{"tests": ["t\\u0000"]}'),
  ("run", '{"tests": [null]}'),
  ("run", '{"tests": ["-p", "evil"]}'),
  ("run", '{"tests": null, "command": null}'),
  ("write_file", '{"path": "minipkg/core.py/x.py", "content": "x"}'),
  ("write_file", '{"path": "minipkg", "content": "x"}'),
  ("write_file", json.dumps({"path": "big.py", "content": "x" * (2 << 20)})),
  ("append", json.dumps({"path": "minipkg/core.py", "code": "x" * (2 << 20)})),
  ("read_file", '{"path": "minipkg/core.py", "start_line": 1.5}'),
  ("read_file", '{"path": "minipkg/core.py", "start_line": true}'),
  ("read_file", '{"path": NaN}'),
  ("read_file", '{"path": "' + "a/" * 5000 + '"}'),
  ("read_file", "[" * 100_000),
  ("read_file", "null"),
  ("read_file", None),
  ("read_file", b"{}"),
  ("read_file", {"path": "minipkg/core.py"}),
  (None, "{}"),
  (12, "{}"),
  ("submit", '{"x": 1}'),
]


def test_malformed_arguments_are_observations_and_the_batch_goes_on(hypot_task):
  s = agent_tools.Session(hypot_task, agent_tools.Budget(command=bwrap.Limits(wall_s=5.0)))
  calls = [agent_episode.Call(name, args) for name, args in MALFORMED]
  calls.append(agent_episode.Call("run", json.dumps({"command": "ls minipkg"})))
  out = agent_episode.act(agent_episode.Job(s, 0, calls, None))
  errors = [(c.name, c.observation.error) for c in out.calls]
  assert all(e for _, e in errors[:-1]), errors  # every malformed call is an error observation
  assert errors[-1] == ("run", "") and "core.py" in out.calls[-1].observation.text
  assert not s.submitted and s.diff() == ""  # nothing was written
  # An optional null is an absent argument, not an error.
  assert s.call("read_file", '{"path": "minipkg/core.py", "start_line": null}').error == ""
