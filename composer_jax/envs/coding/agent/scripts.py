"""Scripted coding agents: fixed model turns in the Kimi K2.5 format, played through `CodingEnv`
and `rl.episodes.run_episodes` (tests, the episode benchmark, format warm-up data).

  oracle_calls(task)   the gold patch as harness calls (`edit` per changed block, `write_file`)
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
from composer_jax.envs.coding import project
from composer_jax.envs.coding.sandbox import grader
from composer_jax.rl.episodes import run_episodes


def call(name: str, **arguments) -> tuple[str, str]:
  return name, json.dumps(arguments)


def turn_ids(tokenizer, calls=(), content: str = "", raw: str | None = None,
             thinking: bool = True, think: str = "") -> list[int]:
  """The tokens a policy writes for one assistant turn after the generation prompt's pre-fill
  (`chat.prefill(thinking)`): `calls` [(name, raw JSON)] rendered in Kimi's format, or `raw`
  text (e.g. a malformed call) followed by <|im_end|>."""
  if raw is not None:
    return tokenizer.encode(raw) + [tokenizer.special_tokens["<|im_end|>"]]
  tool_calls = [chat.ToolCall(n, a, i) for i, (n, a) in enumerate(calls)]
  message = chat.Message("assistant", content, think if thinking else "", tool_calls)
  r = chat.render_message(tokenizer, message)
  return r.ids[r.trainable].tolist()[1 if thinking else 2:]  # <think> (</think>): the pre-fill


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
