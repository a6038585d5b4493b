"""Scripted coding agents: fixed model turns in the Kimi K2.5 format, played through `CodingEnv`
and `rl.episodes.run_episodes` (tests, the episode benchmark, format warm-up data).

  oracle_calls(task)   the gold patch as harness calls (`edit` per changed block, `write_file`)
  append_calls(task)   a deletion task's gold patch as short `append` calls (small models)
  turn_ids(tok, calls) the tokens a policy writes for one assistant turn (after the pre-fill)
  scripted_policy      an `rl.episodes` policy that plays fixed turns, one per round
  play(env, tasks, scripts)  the episodes
"""

import difflib
import json
import tempfile
from pathlib import Path

import jax
import numpy as np

from composer_jax import chat
from composer_jax.codetasks import project
from composer_jax.codetasks.sandbox import grader
from composer_jax.rl.episodes import run_episodes
from composer_jax.rl.trajectory import Trajectory, Turn


def call(name: str, **arguments) -> tuple[str, str]:
  return name, json.dumps(arguments)


def turn_ids(
  tokenizer,
  calls=(),
  content: str = "",
  raw: str | None = None,
  thinking: bool = True,
  think: str = "",
) -> list[int]:
  """The tokens a policy writes for one assistant turn after the generation prompt's pre-fill
  (`chat.prefill(thinking)`): `calls` [(name, raw JSON)] rendered in Kimi's format, or `raw`
  text (e.g. a malformed call) followed by <|im_end|>."""
  if raw is not None:
    return tokenizer.encode(raw) + [tokenizer.special_tokens["<|im_end|>"]]
  tool_calls = [chat.ToolCall(n, a, i) for i, (n, a) in enumerate(calls)]
  message = chat.Message("assistant", content, think if thinking else "", tool_calls)
  r = chat.render_message(tokenizer, message)
  return r.ids[r.trainable].tolist()[1 if thinking else 2 :]  # <think> (</think>): the pre-fill


def scripted_policy(scripts: list[list[list[int]]], pad_id: int):
  """`rl.episodes` policy playing episode b's turns `scripts[b]` in order, one per round."""
  rounds = [0]

  def policy(prompts, prompt_lens, key):
    del prompts, prompt_lens, key
    r = rounds[0]
    rounds[0] += 1
    turns = [s[min(r, len(s) - 1)] for s in scripts]
    n = max(len(t) for t in turns)
    tokens = np.full((len(turns), n), pad_id, np.int32)
    for b, t in enumerate(turns):
      tokens[b, : len(t)] = t
    lengths = np.array([len(t) for t in turns], np.int32)
    return tokens, np.full(tokens.shape, -1.0, np.float32), lengths

  return policy


def play(env, tasks, scripts):
  """Episodes of `tasks` played by `scripts` (turn ids per episode) through `env`."""
  return run_episodes(
    env,
    tasks,
    list(range(len(tasks))),
    scripted_policy(scripts, env.pad_id),
    jax.random.key(0),
    prompt_len=env.budget.max_tokens,
    pad_id=env.pad_id,
  )


def oracle_calls(task) -> list[tuple[str, str]]:
  """The gold patch as harness calls: an `edit` per changed block (old text with one line of
  context, unique in the file) and `write_file` for new files or non-unique blocks."""
  with tempfile.TemporaryDirectory() as tmp:
    before = Path(tmp, "before")
    after = Path(tmp, "after")
    project.unpack(task.workspace, before)
    project.unpack(task.workspace, after)
    assert not grader.apply_patch(after, task.gold_patch)
    calls = []
    for rel in project.walk(after):
      new = (after / rel).read_text()
      old = (before / rel).read_text() if (before / rel).exists() else None
      if old == new:
        continue
      if old is None:
        calls.append(call("write_file", path=rel, content=new))
        continue
      a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
      ops = [o for o in difflib.SequenceMatcher(None, a, b).get_opcodes() if o[0] != "equal"]
      edits = []
      for _, i1, i2, j1, j2 in reversed(ops):  # bottom-up: earlier blocks keep their text
        lo, hi = max(i1 - 1, 0), min(i2 + 1, len(a))
        old_text = "".join(a[lo:hi])
        new_text = "".join(a[lo:i1] + b[j1:j2] + a[i2:hi])
        edits.append(call("edit", path=rel, old_text=old_text, new_text=new_text))
        if old.count(old_text) != 1:
          edits = [call("write_file", path=rel, content=new)]
          break
      calls += edits
    return calls


def _docstring_free(lines: list[str]) -> list[str]:
  """`lines` of a function without its docstring (the statement already shows it)."""
  out, i = list(lines[:1]), 1
  if i < len(lines) and lines[i].strip().startswith(('"""', "'''")):
    quote = lines[i].strip()[:3]
    while i < len(lines) and not (
      lines[i].strip().endswith(quote) and (i > 1 or len(lines[i].strip()) > 3)
    ):
      i += 1
    i += 1
  return out + lines[i:]


def append_calls(task) -> list[tuple[str, str]]:
  """A deletion task's gold patch as short `append` calls: each restored top-level function
  (without its docstring) appended to its module, and a `from .module import name` appended
  to the package's `__init__.py` when the gold patch re-exports it there. One-line ValueError
  for a gold patch that changes anything else (e.g. a bug fix)."""
  with tempfile.TemporaryDirectory() as tmp:
    before, after = Path(tmp, "before"), Path(tmp, "after")
    project.unpack(task.workspace, before)
    project.unpack(task.workspace, after)
    assert not grader.apply_patch(after, task.gold_patch)
    calls = []
    for rel in project.walk(after):
      old = (before / rel).read_text() if (before / rel).exists() else ""
      new = (after / rel).read_text()
      if old == new:
        continue
      if rel.endswith("__init__.py"):  # a re-export: appended with its function below
        continue
      a, b = old.splitlines(), new.splitlines()
      for op, _, _, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
          continue
        added = b[j1:j2]
        defs = [k for k, line in enumerate(added) if line.startswith("def ")]
        if op != "insert" or not defs:
          raise ValueError(f"task {task.id}: {rel} changes more than an added function")
        for k, start in enumerate(defs):
          body = added[start : defs[k + 1] if k + 1 < len(defs) else len(added)]
          while body and not body[-1].strip():
            body.pop()
          name = body[0][4 : body[0].index("(")]
          calls.append(call("append", path=rel, code="\n".join(_docstring_free(body))))
          init = str(Path(rel).parent / "__init__.py")
          if init != rel and (after / init).exists() and name in (after / init).read_text():
            calls.append(call("append", path=init, code=f"from .{Path(rel).stem} import {name}"))
    return calls


def oracle_trajectory(env, task):
  """The scripted episode of `task` as a supervised example (`rl.trajectory.Trajectory`, model
  turns = the policy's tokens, zero log-probs): the oracle's turn (`append_calls` when the env
  offers `append`, else `oracle_calls`) played through `env`'s real harness (its observations
  are the replies), then `submit` (not played: no grading)."""
  state, first = env.reset(task)
  thinking = env.prefill == chat.prefill(True)
  turns = [Turn(first)]
  oracle = append_calls(task) if "append" in env.tools else oracle_calls(task)
  for calls in (oracle, [call("submit")]):
    ids = turn_ids(env.tokenizer, calls, thinking=thinking)
    turns.append(Turn(ids, [0.0] * len(ids)))
    if calls[0][0] != "submit":
      state, reply = env.step(state, ids)
      if state.done:
        raise ValueError(
          f"task {task.id}: the oracle episode ended after its first turn "
          f"({state.end}); raise the episode's budget"
        )
      turns.append(Turn(reply))
  return Trajectory.from_turns(turns, 1.0, 0)
