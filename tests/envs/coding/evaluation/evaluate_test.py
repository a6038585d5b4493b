"""The eval CLI (`python -m experiments.eval`) on the CI mini project, pass@k, the split."""

import base64
import csv
import dataclasses
import gzip
import io
import json
import math
import os
import re
import tarfile
from pathlib import Path

import jax
import numpy as np
import pytest

from composer_jax.codetasks import project
from composer_jax.codetasks import task as task_lib
from composer_jax.codetasks.synthesis import split
from composer_jax.data.tokenizer import TiktokenTokenizer, write_byte_ranks
from composer_jax.envs.coding.agent import scripts as agent_scripts
from composer_jax.envs.coding.agent import tools as agent_tools
from composer_jax.envs.coding.evaluation import evaluate
from composer_jax.hf import checkpoint as hf_checkpoint
from composer_jax.model import config as model_config
from composer_jax.model import transformer
from experiments import eval as eval_cli
from tests.codetasks.mini_project import requires_sandbox


@pytest.fixture(scope="module")
def random_checkpoint(tmp_path_factory) -> Path:
  """A tiny random policy as an imported checkpoint, with a byte tiktoken file beside it."""
  ckpt = tmp_path_factory.mktemp("ckpt")
  cfg = model_config.get_preset("tiny", num_layers=2, max_position_embeddings=4096)
  variables = jax.tree.map(np.asarray, transformer.init(cfg, jax.random.key(0)))
  hf_checkpoint.save(str(ckpt), cfg, variables)
  write_byte_ranks(str(ckpt / "tiktoken.model"))
  return ckpt


def _one_line_error(capsys) -> str:
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and err.startswith("error: "), err
  return err


@requires_sandbox
@pytest.mark.slow
def test_eval_cli_writes_json_csv_png(mini_gen, random_checkpoint, tmp_path, capsys):
  tasks_file = tmp_path / "tasks.jsonl"
  task_lib.write_jsonl(tasks_file, mini_gen[1])
  out = tmp_path / "out"
  rc = eval_cli.main(
    [
      "--tasks",
      str(tasks_file),
      "--checkpoint",
      str(random_checkpoint),
      "--k",
      "2",
      "--samples",
      "3",
      "--config.env.heldout_fraction=1",
      "--config.env.max_turns=2",
      "--config.rl.seq_len=2600",
      "--config.rl.max_new_tokens=16",
      "--out",
      str(out),
    ]
  )
  assert rc == 0, capsys.readouterr().err
  report = json.loads((out / "eval.json").read_text())
  assert (out / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  with open(out / "episodes.csv") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 3 * len(mini_gen[1]) == report["summary"]["episodes"]
  # pass@k recomputed from the CSV with binomials (Chen et al. eq. 1), independently.
  for k in (1, 2):
    per_task = []
    for t in mini_gen[1]:
      passed = [r["passed"] == "True" for r in rows if r["task"] == t.id]
      n, c = len(passed), sum(passed)
      per_task.append(1 - math.comb(n - c, k) / math.comb(n, k))
    assert report["summary"][f"pass@{k}"] == pytest.approx(np.mean(per_task))
  for name in evaluate.BEHAVIOUR:
    column = [
      float(r[name] == "True") if r[name] in ("True", "False") else float(r[name]) for r in rows
    ]
    assert report["summary"][f"{name}_per_episode"] == pytest.approx(np.mean(column))
  # Every episode ran to an end through the harness: the prompt alone is > 1500 tokens.
  assert all(r["end"] and int(r["tokens"]) > 1500 and 1 <= int(r["turns"]) <= 2 for r in rows)
  assert report["meta"]["split_projects"] == ["minipkg-1.0"]
  printed = json.loads(capsys.readouterr().out)
  assert printed["files"]["png"] == str(out / "eval.png")


def _fake_task(name: str, project_name: str) -> task_lib.Task:
  empty = project.pack(Path("."), [])
  return task_lib.Task(
    id=name,
    source={"name": project_name},
    features=[],
    problem_statement="x",
    deletion_diff="",
    gold_patch="",
    workspace=empty,
    hidden_files=empty,
    FAIL_TO_PASS=["t"],
    PASS_TO_PASS=["u"],
    provenance={},
  )


def _record(tasks_file, **change):
  """Rewrites the one record of `tasks_file` with `change` applied."""
  record = json.loads(tasks_file.read_text())
  tasks_file.write_text(json.dumps({**record, **change}) + "\n")


def _escaping_blob() -> str:
  """A tar.gz whose member would be written outside the workspace."""
  buf = io.BytesIO()
  with gzip.GzipFile(fileobj=buf, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
    tar.addfile(tarfile.TarInfo("../outside.py"), io.BytesIO(b""))
  return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize(
  "case, expected",
  [
    ("empty_tasks", "holds no tasks"),
    ("not_jsonl", "line 1 is not JSON"),
    # Malformed records: one line naming the file, line and field, before any model work.
    ("record_is_a_string", "line 1: a task record is a JSON object, got str"),
    ("source_is_a_string", "line 1: task field 'source' must be a JSON object, got \"proj\""),
    ("tests_not_strings", "task field 'FAIL_TO_PASS' must be a list of strings"),
    ("unknown_field", "task record has unknown ['oops']"),
    ("missing_field", "task record lacks ['workspace']"),
    ("workspace_not_base64", "task field 'workspace': not a packed project"),
    ("workspace_not_a_tar", "task field 'workspace': not a packed project"),
    ("workspace_escapes", "task field 'workspace': not a packed project"),
    ("out_is_a_file", "is a file, not a directory"),
    ("out_is_the_checkpoint", "is the input"),
    ("out_holds_other_files", "is not empty (it holds 'notes.txt')"),
    ("no_task_file", "does not exist; give a make_tasks JSONL"),
    ("no_tokenizer", "has no tiktoken.model; pass --tokenizer"),
    ("missing_tokenizer", "neither 'byte' nor an existing tiktoken file"),
    ("byte_tokenizer", "needs a tiktoken file"),
    ("not_a_checkpoint", "is none of"),
    ("empty_split", "heldout split of"),
    ("unknown_tool", "shell"),
    (
      "unknown_setting",
      "--config.rl.temprature=0.5: eval reads --config.FIELD=VALUE for the "
      "fields ['env.heldout_fraction', ",
    ),
    ("setting_of_another_type", "--config.env.max_turns=many: invalid literal for int()"),
  ],
)
def test_bad_input_is_one_line(tmp_path, capsys, case, expected):
  tasks_file, ckpt = tmp_path / "tasks.jsonl", tmp_path / "ckpt"
  ckpt.mkdir()
  task_lib.write_jsonl(tasks_file, [_fake_task("a", "proj")])
  write_byte_ranks(str(ckpt / "tiktoken.model"))
  args = ["--tasks", str(tasks_file), "--checkpoint", str(ckpt), "--config.env.heldout_fraction=1"]
  if case == "empty_tasks":
    tasks_file.write_text("")
  elif case == "not_jsonl":
    tasks_file.write_text("{not json\n")
  elif case == "record_is_a_string":
    tasks_file.write_text('"a task"\n')
  elif case == "source_is_a_string":
    _record(tasks_file, source="proj")
  elif case == "tests_not_strings":
    _record(tasks_file, FAIL_TO_PASS=[1])
  elif case == "unknown_field":
    _record(tasks_file, oops=1)
  elif case == "missing_field":
    record = json.loads(tasks_file.read_text())
    del record["workspace"]
    tasks_file.write_text(json.dumps(record) + "\n")
  elif case == "workspace_not_base64":
    _record(tasks_file, workspace="not base64!")
  elif case == "workspace_not_a_tar":
    _record(tasks_file, workspace=base64.b64encode(b"plain text").decode())
  elif case == "workspace_escapes":
    _record(tasks_file, workspace=_escaping_blob())
  elif case == "out_is_a_file":
    args += ["--out", str(tasks_file)]
  elif case == "out_is_the_checkpoint":
    args += ["--out", str(ckpt)]
  elif case == "out_holds_other_files":
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    args += ["--out", str(tmp_path / "o")]
  elif case == "no_task_file":
    tasks_file.unlink()
  elif case == "no_tokenizer":
    (ckpt / "tiktoken.model").unlink()
  elif case == "missing_tokenizer":
    args += ["--tokenizer", str(tmp_path / "absent.model")]
  elif case == "byte_tokenizer":
    args += ["--tokenizer", "byte"]
  elif case == "empty_split":
    args += ["--config.env.heldout_fraction=0"]
  elif case == "unknown_tool":
    args += ["--config.env.tools=read_file,shell"]
  elif case == "unknown_setting":
    args += ["--config.rl.temprature=0.5"]
  elif case == "setting_of_another_type":
    args += ["--config.env.max_turns=many"]
  assert eval_cli.main(args) == 1
  assert expected in _one_line_error(capsys)


def test_results_replace_an_earlier_eval_whole_or_survive_a_failed_write(
  tmp_path, capsys, monkeypatch
):
  """A re-run replaces an earlier evaluation's files as a whole; when the results cannot be
  written (disk full), the earlier files stay and the whole report goes to stdout."""
  tasks_file, ckpt, out = tmp_path / "tasks.jsonl", tmp_path / "ckpt", tmp_path / "ckpt" / "eval"
  out.mkdir(parents=True)
  (out / "eval.json").write_text("earlier")
  (out / "stale.csv").write_text("")
  task_lib.write_jsonl(tasks_file, [_fake_task("a", "proj")])
  write_byte_ranks(str(ckpt / "tiktoken.model"))
  row = dict(
    task="a", project="proj", passed=True, reward=1.0, **{m: 1 for m in evaluate.BEHAVIOUR}
  )
  monkeypatch.setattr(
    eval_cli.load_checkpoint, "load", lambda _: (model_config.get_preset("tiny"), {})
  )
  monkeypatch.setattr(evaluate, "evaluate", lambda *a: evaluate.summarize([row], 1))
  args = ["--tasks", str(tasks_file), "--checkpoint", str(ckpt), "--config.env.heldout_fraction=1"]
  assert eval_cli.main(args) == 1  # a foreign file in the eval directory: refused first
  assert "is not empty (it holds 'stale.csv')" in _one_line_error(capsys)
  (out / "stale.csv").unlink()

  write = eval_cli.write_report

  def disk_full(report, out_dir, meta):
    with open(f"{out_dir}/eval.json", "w") as f:
      f.write("half")
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(eval_cli, "write_report", disk_full)
  assert eval_cli.main(args) == 1
  captured = capsys.readouterr()
  assert json.loads(captured.out)["summary"]["pass@1"] == 1.0
  assert captured.err.startswith(f"error: cannot write the results to {out} ")
  assert os.listdir(out) == ["eval.json"] and (out / "eval.json").read_text() == "earlier"

  monkeypatch.setattr(eval_cli, "write_report", write)
  assert eval_cli.main(args) == 0
  assert sorted(os.listdir(out)) == ["episodes.csv", "eval.json", "eval.png"]
  assert json.loads((out / "eval.json").read_text())["summary"]["pass@1"] == 1.0
  assert not [n for n in os.listdir(ckpt) if ".partial-" in n or ".replaced-" in n]


@pytest.mark.parametrize(
  "n, c, k", [(1, 0, 1), (1, 1, 1), (5, 2, 1), (5, 2, 3), (10, 3, 4), (10, 7, 4), (200, 13, 100)]
)
def test_pass_at_k_matches_binomials(n, c, k):
  assert evaluate.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_rejects_k_above_n():
  with pytest.raises(ValueError, match="1 <= k=3 <= n=2"):
    evaluate.pass_at_k(2, 1, 3)


def test_split_is_by_project_and_stable():
  tasks = [_fake_task(f"{p}-{i}", p) for p in (f"proj{j}" for j in range(40)) for i in range(3)]
  train, held = split.split_by_project(tasks, 0.25, seed=1)
  held_projects = {split.project_of(t) for t in held}
  assert held_projects.isdisjoint(split.project_of(t) for t in train)
  assert len(train) + len(held) == len(tasks) and 3 <= len(held_projects) <= 17
  # A project's side depends on itself only: the same with other projects around, or alone.
  _, held_alone = split.split_by_project([t for t in tasks if t.source["name"] == "proj5"], 0.25, 1)
  assert bool(held_alone) == ("proj5" in held_projects)
  assert split.split_by_project(tasks, 0.0)[1] == [] and split.split_by_project(tasks, 1.0)[0] == []
  moved = dataclasses.replace(tasks[0], id="again")
  assert (moved in split.split_by_project([moved], 0.25, 1)[1]) == (tasks[0] in held)


@requires_sandbox
@pytest.mark.slow
def test_scripted_policies_are_counted_right(hypot_task, tmp_path):
  """Samples of one task played by scripts through the real harness and grader: the oracle
  passes, a no-op and an edit adding an unused import fail; pass@k and behaviour by hand."""
  tok = TiktokenTokenizer(write_byte_ranks(str(tmp_path / "bytes.tiktoken")))
  gold = agent_scripts.oracle_calls(hypot_task)
  t = lambda *calls: agent_scripts.turn_ids(tok, calls)
  submit = agent_scripts.call("submit")
  unused_import = agent_scripts.call(
    "edit",
    path="minipkg/core.py",
    old_text="def add_numbers(",
    new_text="import os\n\n\ndef add_numbers(",
  )
  scripts = [[t(*gold), t(submit)], [t(submit)], [t(unused_import), t(submit)]]
  cfg = evaluate.EvalConfig(
    k=3, budget=agent_tools.Budget(max_turns=4, max_tokens=12000), max_turn_tokens=2500, batch=3
  )
  report = evaluate.play([hypot_task], agent_scripts.scripted_policy(scripts, tok.pad_id), tok, cfg)
  rows = report["episodes"]
  assert [r["passed"] for r in rows] == [True, False, False]
  assert [r["edits"] for r in rows] == [len(gold), 0, 1]
  assert [r["style_violations"] for r in rows] == [0, 0, 1]  # F401 `os` imported but unused
  assert [r["turns"] for r in rows] == [2, 1, 2] and all(r["submitted"] for r in rows)
  assert report["summary"]["pass@1"] == pytest.approx(1 / 3)
  assert report["summary"]["pass@2"] == pytest.approx(1 - 1 / 3)  # 1 - C(2,2)/C(3,2)
  assert report["summary"]["pass@3"] == 1.0
  assert report["summary"]["style_violations_per_edit"] == pytest.approx(1 / (len(gold) + 1))


def test_settings_are_the_runs_own_with_overrides():
  """An RL workdir's run config gives the settings; `--config.` overrides win; without a run
  config they are eval's defaults (the episode budget 0 then comes from the model)."""
  run = {
    "env": {
      "heldout_fraction": 0.3,
      "split_seed": 2,
      "max_turns": 3,
      "tools": ["edit", "submit"],
      "tasks": "t.jsonl",
    },
    "rl": {"seq_len": 2900, "max_new_tokens": 512, "temperature": 0.9, "groups": 4},
  }
  c = eval_cli.settings(
    run, ["--config.env.max_turns=5", "--config.rl.top_p=0.5", "--config.env.thinking=false"]
  )
  assert c.env.to_dict() == dict(
    heldout_fraction=0.3,
    split_seed=2,
    max_turns=5,
    tools=("edit", "submit"),
    thinking=False,
    system="",
    statement="full",
  )
  assert c.rl.to_dict() == dict(seq_len=2900, max_new_tokens=512, temperature=0.9, top_p=0.5)
  c = eval_cli.settings({}, ["--config.env.tools=read_file,submit"])
  assert (
    c.env.heldout_fraction,
    c.env.split_seed,
    c.env.max_turns,
    c.rl.max_new_tokens,
    c.rl.seq_len,
  ) == (0.2, 0, 30, 1024, 0)
  assert c.env.tools == ("read_file", "submit")
  assert eval_cli.defaults().env.tools == tuple(agent_tools.TOOL_NAMES)


@pytest.mark.parametrize(
  "override, message",
  [
    ("--config.rl.seq_len=8000", "exceeds the model's max_position_embeddings=4096"),
    # A NaN temperature sampled garbage episodes and wrote their report (rl.rollout).
    ("--config.rl.temperature=nan", "rl.temperature=nan must be finite and >= 0"),
    ("--config.rl.top_p=0", "rl.top_p=0.0 must be in (0, 1]"),
  ],
)
def test_settings_the_model_cannot_sample_with_are_one_line(override, message, tmp_path, capsys):
  cfg = model_config.get_preset("tiny", num_layers=1, max_position_embeddings=4096)
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))  # no compile
  hf_checkpoint.save(str(tmp_path), cfg, jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes))
  write_byte_ranks(str(tmp_path / "tiktoken.model"))
  tasks_file = tmp_path / "tasks.jsonl"
  task_lib.write_jsonl(tasks_file, [_fake_task("a", "proj")])
  args = ["--tasks", str(tasks_file), "--checkpoint", str(tmp_path), "--split", "all", override]
  assert eval_cli.main(args) == 1
  assert message in _one_line_error(capsys)


@pytest.mark.parametrize(
  "override, message",
  [
    ("--config.env.heldout_fraction=nan", "env.heldout_fraction=nan must be in [0, 1]"),
    ("--config.env.heldout_fraction=1.5", "env.heldout_fraction=1.5 must be in [0, 1]"),
    ("--config.env.max_turns=0", "env.max_turns=0 must be >= 1"),
    ("--config.rl.max_new_tokens=-1", "rl.max_new_tokens=-1 must be >= 1"),
  ],
)
def test_settings_out_of_range_are_one_line_when_read(override, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    eval_cli.settings({}, [override])
