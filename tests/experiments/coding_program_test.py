"""rl_coding end to end on the CI mini project's tasks: RL steps on coding episodes with a tiny
random policy, and a bit-exact resume (`experiments/coding/program.py`, `rl.run`)."""

import os
import shutil
from pathlib import Path

import pytest

from composer_jax.codetasks import project
from composer_jax.codetasks import task as task_lib
from composer_jax.codetasks.synthesis import split
from composer_jax.data import tokenizer as tokenizer_lib
from composer_jax.train import checkpointing, load_checkpoint
from composer_jax.train.metrics import read_metrics
from experiments.coding import program
from experiments.configs import rl_coding
from tests.codetasks.conftest import mini_gen, mini_root  # noqa: F401 (fixtures)
from tests.codetasks.mini_project import requires_sandbox

pytestmark = requires_sandbox
STEPS = 2


@pytest.fixture(scope="module")
def tasks_file(mini_gen, tmp_path_factory):  # noqa: F811
  path = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"
  task_lib.write_jsonl(path, mini_gen[1])
  return str(path)


def _config(tasks_file, cache, steps=STEPS):
  c = rl_coding.get_config("cpu")
  c.env.tasks = tasks_file
  c.env.curriculum.min_rollouts = 2
  c.train.update(steps=steps, ckpt_every=1, compile_cache_dir=str(cache))
  c.optim.total_steps = STEPS  # one LR schedule for runs stopped early and resumed
  # CI size: 2 layers, two tools (a ~0.9k-token first prompt in byte tokens), short turns.
  c.model.num_layers = 2
  c.env.tools = ("edit", "submit")
  c.rl.update(seq_len=1536, prompt_len=1536, teacher_seq_len=1792, max_new_tokens=16)
  c.env.max_hint_tokens = 256  # teacher rows: 1536 + 256
  return c


def _comparable(records):
  """The records without wall times (`*seconds*`, `*_s`, `*_s_total`): all else is bit-exact."""
  timing = lambda k: "seconds" in k or k.endswith(("_s", "_s_total"))
  return [{k: v for k, v in r.items() if not timing(k)} for r in records]


@pytest.mark.slow
def test_rl_coding_steps_and_resumes_bit_for_bit(tasks_file, tmp_path):
  cache = tmp_path / "cache"
  full_dir = str(tmp_path / "full")
  full = program.run(_config(tasks_file, cache), full_dir)
  assert [r["step"] for r in full] == [1, 2]
  assert _comparable(read_metrics(full_dir)) == _comparable(full)
  for r in full:  # episodes were sampled, graded and flagged; the update ran
    assert r["tokens_per_episode"] > 800 and r["turns_per_episode"] >= 1
    assert r["flagged_turns"] >= 1 and r["num_model_tokens"] > 0 and r["grad_norm"] > 0
  assert full[-1]["curriculum/retired"] >= 1  # never solved after 2 rollouts: retired
  # What `python -m experiments.eval --checkpoint WORKDIR` reads: the run's settings, the
  # tokenizer.
  assert load_checkpoint.run_config(full_dir)["rl"]["seq_len"] == 1536
  assert tokenizer_lib.find_tokenizer_near(full_dir)
  # A run stopped after step 1: the full run's directory without the step-2 checkpoint.
  split_dir = tmp_path / "split"
  shutil.copytree(full_dir, split_dir)
  shutil.rmtree(split_dir / "checkpoints" / "2")
  ckpt = checkpointing.Checkpointer(str(split_dir), keep=2)
  saved = ckpt.restore_data(1)["env"]["curriculum"]  # the env's state rides in the checkpoint
  ckpt.close()
  assert sum(v["rollouts"] for v in saved["stats"].values()) == 4  # step 1: 2 groups x 2
  resumed = program.run(_config(tasks_file, cache), str(split_dir))
  assert sorted(os.listdir(split_dir / "checkpoints")) == ["1", "2"]
  assert _comparable(resumed) == _comparable(full[1:])  # same episodes, losses, curriculum


def test_bad_task_file_and_tokenizer_are_one_line(tmp_path):
  c = rl_coding.get_config("cpu")
  (tmp_path / "empty.jsonl").write_text("")
  for tasks, match in (("", "is not a file"), (str(tmp_path / "empty.jsonl"), "holds no tasks")):
    c.env.tasks = tasks
    with pytest.raises(ValueError, match=match):
      program.make_env(c, str(tmp_path))
  c.env.tokenizer = str(tmp_path / "missing.tiktoken")
  with pytest.raises(ValueError, match="neither 'byte' nor an existing tiktoken file"):
    program.load_tokenizer(c, str(tmp_path))


def test_source_gives_the_curriculum_harder_variants(mini_root, mini_gen, tmp_path):  # noqa: F811
  c = rl_coding.get_config("cpu")
  assert program.harder_variants(c, str(tmp_path)) is None
  c.env.source = str(mini_root)
  c.env.source_options = {"baseline_runs": 1, "max_f2p_fraction": 0.7}  # as conftest made them
  harder = program.harder_variants(c, str(tmp_path))
  hypot = next(t for t in mini_gen[1] if t.features[0]["qualname"] == "hypot_scaled")
  (variant,) = harder(hypot)  # hypot_scaled + a related feature of the same module
  assert len(variant.features) == 2 and set(hypot.FAIL_TO_PASS) < set(variant.FAIL_TO_PASS)


def _task(task_id: str, project_name: str, statement: str = "") -> task_lib.Task:
  """A task record with an empty workspace (a blob `task.load_jsonl` accepts)."""
  empty = project.pack(Path("."), [])
  return task_lib.Task(
    task_id, {"name": project_name}, [], statement, "", "", empty, empty, [], [], {}
  )


def test_rl_trains_on_the_train_split_only(tmp_path):
  """RL and eval agree on the project-hash split: 'theta' hashes to held out at 0.2."""
  t = lambda name: _task(f"{name}-t", name)
  tasks = [t("alpha"), t("theta"), t("beta")]
  assert split.split_by_project(tasks, 0.2)[1] == [tasks[1]]
  c = rl_coding.get_config("cpu")
  path = tmp_path / "tasks.jsonl"
  task_lib.write_jsonl(path, tasks)
  c.env.tasks = str(path)
  env = program.make_env(c, str(tmp_path))
  assert sorted(env.tasks) == ["alpha-t", "beta-t"]
  task_lib.write_jsonl(path, [tasks[1]])
  with pytest.raises(ValueError, match="all 1 projects are held out at env.heldout_fraction=0.2"):
    program.make_env(c, str(tmp_path))


def _fake_tasks(tmp_path, statements):
  path = tmp_path / "tasks.jsonl"
  task_lib.write_jsonl(path, [_task(f"t{i}", "alpha", s) for i, s in enumerate(statements)])
  return str(path)


def test_token_lengths_are_derived_from_the_tasks_and_checked(tmp_path):
  c = rl_coding.get_config("cpu")
  c.env.tasks = _fake_tasks(tmp_path, ["short", "x" * 1000])
  env = program.make_env(c, str(tmp_path))
  longest = max(env.prompt_tokens(t) for t in env.tasks.values())
  assert longest == env.prompt_tokens(env.tasks["t0"]) + 1000 - 5
  r = c.rl
  assert r.seq_len == longest + c.env.max_turns * r.max_new_tokens == env.budget.max_tokens
  assert (r.prompt_len, r.teacher_seq_len) == (r.seq_len, r.seq_len + c.env.max_hint_tokens)
  # The workdir keeps its tokenizer where eval looks for it.
  found = tokenizer_lib.find_tokenizer_near(str(tmp_path))
  assert tokenizer_lib.load_tokenizer({"tokenizer": found}).vocab_size == 512
  bad = [
    (
      dict(seq_len=longest + 511),
      f"rl.seq_len={longest + 511} < the longest first prompt "
      rf"\({longest} tokens\) \+ rl.max_new_tokens=512",
    ),
    (dict(teacher_seq_len=100), "rl.teacher_seq_len=100 < .*env.max_hint_tokens=384"),
    (dict(seq_len=5000, teacher_seq_len=0), "max_position_embeddings=4096 < 5511 tokens"),
  ]
  for overrides, match in bad:
    c = rl_coding.get_config("cpu")
    c.env.tasks = _fake_tasks(tmp_path, ["short", "x" * 1000])
    c.rl.update(overrides)
    with pytest.raises(ValueError, match=match):
      program.make_env(c, str(tmp_path))


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("loss.divergence", "kl", "loss.divergence='kl'; valid: ('reverse_kl', 'forward_kl', 'jsd')"),
    ("loss.sd_coef", float("nan"), "loss.sd_coef=nan must be finite and >= 0"),
    ("rl.top_p", 0.0, "rl.top_p=0.0 must be in (0, 1]"),
  ],
)
def test_bad_rl_settings_are_one_line_before_the_warmup(
  field, value, message, tmp_path, monkeypatch
):
  """As tests/rl/run_test for the tool program: rl_coding:micro (a 300-step warm-up first)
  checks its RL settings before the warm-up starts."""
  monkeypatch.setattr(program.warmup, "warmup", lambda *a: pytest.fail("the warm-up started"))
  c = rl_coding.get_config("micro")
  c.env.tasks = _fake_tasks(tmp_path, ["short"])
  section, name = field.split(".")
  c[section][name] = value
  with pytest.raises(ValueError) as e:
    program.run(c, str(tmp_path / "w"))
  assert str(e.value).startswith(message)


@pytest.mark.parametrize(
  "change, warned",
  [({}, True), ({"warmup.steps": 5}, False), ({"train.init_from": "/ckpt"}, False)],
)
def test_without_a_warmup_it_says_first_that_reward_stays_zero(change, warned, tmp_path, capsys):
  c = rl_coding.get_config("cpu")  # warmup.steps 0, no init_from
  c.env.tasks = str(tmp_path / "missing.jsonl")  # fails at once, after the warning
  for key, value in change.items():
    section, name = key.split(".")
    c[section][name] = value
  with pytest.raises(ValueError, match="missing.jsonl"):
    program.run(c, str(tmp_path / "w"))
  err = capsys.readouterr().err
  assert (program.NO_WARMUP in err) == warned
  assert not warned or "reward will stay 0" in err and "experiments.coding.learn" in err
