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
import subprocess
import sys
import tarfile
from pathlib import Path

import jax
import numpy as np
import pytest

from composer_jax.codetasks import project
from composer_jax.codetasks import task as task_lib
from composer_jax.codetasks.synthesis import split
from composer_jax.data.tokenizer import TiktokenTokenizer, write_byte_ranks
from composer_jax.envs.coding.agent import env as agent_env
from composer_jax.envs.coding.agent import scripts as agent_scripts
from composer_jax.envs.coding.agent import tools as agent_tools
from composer_jax.envs.coding.evaluation import evaluate
from composer_jax.hf import checkpoint as hf_checkpoint
from composer_jax.model import config as model_config
from composer_jax.model import transformer
from composer_jax.train import loop
from experiments import eval as eval_cli
from experiments.configs import default, rl_coding
from tests.codetasks.mini_project import requires_sandbox


@pytest.fixture(scope="module")
def zero_checkpoint(tmp_path_factory) -> Path:
  """A one-layer tiny model of zeros as an imported checkpoint (no compile), with a byte
  tiktoken file beside it."""
  ckpt = tmp_path_factory.mktemp("zero")
  cfg = model_config.get_preset("tiny", num_layers=1, max_position_embeddings=4096)
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  hf_checkpoint.save(str(ckpt), cfg, jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes))
  write_byte_ranks(str(ckpt / "tiktoken.model"))
  return ckpt


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
  rc = eval_cli.run(
    [
      f"--tasks={tasks_file}",
      f"--checkpoint={random_checkpoint}",
      "--k=2",
      "--samples=3",
      "--config.env.heldout_fraction=1.0",
      "--config.env.max_turns=2",
      "--config.rl.seq_len=2600",
      "--config.rl.max_new_tokens=16",
      f"--out={out}",
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
  # Every episode ran to an end through the harness, with the RL config's four tools: the
  # prompt alone is > 1000 tokens.
  assert all(r["end"] and int(r["tokens"]) > 1000 and 1 <= int(r["turns"]) <= 2 for r in rows)
  assert report["meta"]["settings"]["env"]["tools"] == list(rl_coding.get_config().env.tools)
  assert report["meta"]["split_projects"] == ["minipkg-1.0"]
  captured = capsys.readouterr()
  printed = json.loads(captured.out)
  assert printed["files"]["png"] == str(out / "eval.png")
  # One progress line per batch of 8 episodes: done/total, rate, ETA.
  lines = [ln for ln in captured.err.splitlines() if ln.startswith("eval: ")]
  n = 3 * len(mini_gen[1])
  assert len(lines) == -(-n // 8) and lines[-1].startswith(f"eval: {n}/{n} episodes, ")
  assert all(re.search(r"episodes/s, elapsed \S+, ETA \S+; \d+ passed$", ln) for ln in lines)


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
    ("out_is_the_checkpoint", "is the input"),
    ("out_holds_other_files", "is not empty (it holds 'notes.txt')"),
    ("no_task_file", "is not a file; give a make_tasks JSONL or micro:START:STOP"),
    ("missing_tokenizer", "neither 'byte' nor an existing tiktoken file"),
    ("byte_tokenizer", "the chat format needs 'bytes' or a tiktoken file"),
    ("not_a_checkpoint", "is none of"),
    ("empty_split", "heldout split of"),
    ("heldout_fraction_nan", "env.heldout_fraction=nan must be in [0, 1]"),
    ("unknown_tool", "shell"),
    ("architecture_override", "change the checkpoint's architecture: num_layers (checkpoint"),
  ],
)
def test_bad_input_is_one_line(tmp_path, capsys, case, expected, zero_checkpoint):
  tasks_file, ckpt = tmp_path / "tasks.jsonl", zero_checkpoint
  task_lib.write_jsonl(tasks_file, [_fake_task("a", "proj")])
  args = [f"--tasks={tasks_file}", f"--checkpoint={ckpt}", "--config.env.heldout_fraction=1.0"]
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
  elif case == "out_is_the_checkpoint":
    args += [f"--out={ckpt}"]
  elif case == "out_holds_other_files":
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    args += [f"--out={tmp_path / 'o'}"]
  elif case == "no_task_file":
    tasks_file.unlink()
  elif case == "missing_tokenizer":
    args += [f"--config.env.tokenizer={tmp_path / 'absent.model'}"]
  elif case == "byte_tokenizer":
    args += ["--config.env.tokenizer=byte"]
  elif case == "not_a_checkpoint":
    args[1] = f"--checkpoint={tmp_path}"
  elif case == "empty_split":
    args += ["--config.env.heldout_fraction=0.0"]
  elif case == "heldout_fraction_nan":
    args += ["--config.env.heldout_fraction=nan"]
  elif case == "unknown_tool":
    args += ["--config.env.tools=('read_file','shell')"]
  elif case == "architecture_override":
    args += ["--config.model.num_layers=2"]
  assert eval_cli.run(args) == 1
  assert expected in _one_line_error(capsys)


@pytest.mark.parametrize(
  "flag, expected",
  [
    ("--k=1000000", "flag --k=1000000: 1000000 is not an integer in the range [1, 1000]"),
    ("--k=0", "flag --k=0: 0 is not an integer in the range [1, 1000]"),
    ("--samples=-1", "flag --samples=-1: -1 is not an integer in the range [0, 1000]"),
    ("--k=3 --samples=2", "--samples must be 0 (= k) or >= --k"),
    ("--out=FILE", "it is a file, not a directory"),
    ("--out=FILE/sub", "is a file, so nothing can be written under it"),
    ("--split=test", "flag --split=test: value should be one of <heldout|train|all>"),
    (
      "--config.rl.temprature=0.5",
      "unknown config field 'temprature' in --config.rl.temprature=0.5. Did you mean",
    ),
    ("--config.env.max_turns=many", "flag --config.env.max_turns=many: invalid literal for int()"),
    ("--config=nope.py", "cannot load config file 'nope.py': no such file; configs in"),
  ],
)
def test_bad_flags_are_one_line_and_exit_2(flag, expected, tmp_path):
  """On the command line (a subprocess): one line naming the flag, its value and the valid
  range, exit status 2, no traceback; before any checkpoint is read."""
  (tmp_path / "file").write_text("")
  args = [a.replace("FILE", str(tmp_path / "file")) for a in flag.split()]
  p = subprocess.run(
    [sys.executable, "-m", "experiments.eval", f"--checkpoint={tmp_path}", *args],
    capture_output=True,
    text=True,
    timeout=300,
  )
  lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
  assert p.returncode == 2, p.stderr
  assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], p.stderr


def test_help_lists_every_flag_with_its_default():
  p = subprocess.run(
    [sys.executable, "-m", "experiments.eval", "--helpshort"],
    capture_output=True,
    text=True,
    timeout=300,
  )
  for name, value in [("k", "1"), ("samples", "0"), ("split", "heldout"), ("batch", "8")]:
    assert re.search(rf"--{name}: .*\n(    .*\n)*?    \(default: '{value}'\)", p.stdout), name
  assert "rl_coding.py')" in p.stdout


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
  tiny = model_config.get_preset("tiny", max_position_embeddings=4096)
  monkeypatch.setattr(eval_cli.load_checkpoint, "load", lambda _: (tiny, {}))
  monkeypatch.setattr(evaluate, "evaluate", lambda *a: evaluate.summarize([row], 1))
  args = [f"--tasks={tasks_file}", f"--checkpoint={ckpt}", "--config.env.heldout_fraction=1.0"]
  assert eval_cli.run(args) == 1  # a foreign file in the eval directory: refused first
  assert "is not empty (it holds 'stale.csv')" in _one_line_error(capsys)
  (out / "stale.csv").unlink()

  write = eval_cli.write_report

  def disk_full(report, out_dir, meta):
    with open(f"{out_dir}/eval.json", "w") as f:
      f.write("half")
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(eval_cli, "write_report", disk_full)
  assert eval_cli.run(args) == 1
  captured = capsys.readouterr()
  assert json.loads(captured.out)["summary"]["pass@1"] == 1.0
  assert captured.err.startswith(f"error: cannot write the results to {out} ")
  assert os.listdir(out) == ["eval.json"] and (out / "eval.json").read_text() == "earlier"

  monkeypatch.setattr(eval_cli, "write_report", write)
  assert eval_cli.run(args) == 0
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
  env = agent_env.CodingEnv(
    [hypot_task],
    tok,
    budget=agent_tools.Budget(max_turns=4, max_tokens=12000),
    max_turn_tokens=2500,
  )
  cfg = evaluate.EvalConfig(k=3, batch=3)
  report = evaluate.play(env, [hypot_task], agent_scripts.scripted_policy(scripts, tok.pad_id), cfg)
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
  """A coding run's saved config gives the settings, `--config.` overrides win; any other
  checkpoint gets the `--config` file's (the RL program's defaults: 2 turns, instant mode,
  512-token turns, not a second set of eval defaults); the model is the checkpoint's."""
  micro = rl_coding.get_config("micro")
  saved = json.loads(json.dumps(micro.to_dict()))  # as a checkpoint holds it: lists, not tuples
  saved["model"] = {"preset": "tiny", "overrides": {}}  # an older run config's model section
  file_config = rl_coding.get_config("cpu")
  overrides = {"env.max_turns": 5, "rl.top_p": 0.5, "env.thinking": True}
  c = eval_cli.settings(saved, file_config, overrides)
  assert c.env.tools == ("append", "submit") and c.env.statement == "compact"
  assert (c.env.max_turns, c.rl.top_p, c.env.thinking) == (5, 0.5, True)
  assert c.rl.seq_len == micro.rl.seq_len and c.env.curriculum.min_rollouts == 0
  tiny = model_config.get_preset("tiny", num_layers=2)
  used = eval_cli.with_model(c, tiny, {"model.dtype": "bfloat16"})
  assert used == tiny.replace(dtype="bfloat16") and c.model.num_layers == 2
  c = eval_cli.settings({"method": "lm", "train": {"steps": 300}}, file_config, {})
  assert c.to_dict() == {**file_config.to_dict(), "env": c.env.to_dict()}
  assert (c.env.max_turns, c.env.thinking, c.rl.max_new_tokens) == (2, False, 512)
  with pytest.raises(ValueError, match="holds a coding run's config"):
    eval_cli.settings(saved, file_config, {}, file_given=True)


@pytest.mark.parametrize(
  "override, message",
  [
    ("--config.rl.seq_len=8000", "the model's max_position_embeddings=4096 < 8"),
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
  args = [f"--tasks={tasks_file}", f"--checkpoint={tmp_path}", "--split=all", override]
  assert eval_cli.run(args) == 1
  assert message in _one_line_error(capsys)


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("env.heldout_fraction", float("nan"), "env.heldout_fraction=nan must be in [0, 1]"),
    ("env.heldout_fraction", 1.5, "env.heldout_fraction=1.5 must be in [0, 1]"),
    ("env.max_turns", 0, "env.max_turns=0 must be >= 1"),
    ("rl.max_new_tokens", -1, "rl.max_new_tokens=-1 must be >= 1"),
  ],
)
def test_settings_out_of_range_are_one_line_when_read(field, value, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    eval_cli.settings({}, rl_coding.get_config(), {field: value})


@requires_sandbox
@pytest.mark.slow
def test_a_default_run_checkpoint_evaluates_with_the_tokenizer_that_ships(
  mini_gen, tmp_path, capsys
):
  """The default run's checkpoint (`experiments.run`'s supervised driver on byte tokens, two
  steps at its tiny size; its workdir holds no tokenizer file) is evaluated end to end with
  the RL program's micro settings (`--config=rl_coding.py:micro`): the 256-byte chat tokenizer
  that ships with the code ('bytes', the same byte ids), its factory's env, k=1 on one task."""
  work, out = tmp_path / "default", tmp_path / "eval"
  config = default.get_config()
  config.train.update(steps=2, batch_size=2, seq_len=32, eval_every=0, ckpt_every=2)
  config.optim.warmup_steps = 0
  loop.train(config, str(work))
  assert not (work / "tiktoken.model").exists()
  tasks_file = tmp_path / "tasks.jsonl"
  task_lib.write_jsonl(tasks_file, mini_gen[1][:1])
  rc = eval_cli.run(
    [
      f"--checkpoint={work}",
      f"--tasks={tasks_file}",
      "--split=all",
      f"--config={os.path.join(eval_cli.CONFIG_DIR, 'rl_coding.py')}:micro",
      "--config.env.max_turns=1",
      "--config.rl.max_new_tokens=16",
      "--config.rl.seq_len=0",  # derived from the task: the default model has 1024 positions
      "--config.rl.prompt_len=0",
      "--config.rl.teacher_seq_len=0",
      f"--out={out}",
    ]
  )
  assert rc == 0, capsys.readouterr().err
  report = json.loads((out / "eval.json").read_text())
  played = report["meta"]["settings"]
  assert played["env"]["tokenizer"] == "bytes" and played["env"]["tools"] == ["append", "submit"]
  assert model_config.model_config(played["model"]) == model_config.get_preset("tiny")
  assert report["summary"]["episodes"] == 1 and report["episodes"][0]["tokens"] > 100
  assert sorted(os.listdir(work)) == sorted(
    ["checkpoints", "compile_cache", "metrics.jsonl", "tensorboard"]
  )
