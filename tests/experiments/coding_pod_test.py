"""`rl_coding.py:pod`'s chain on the tiny Hugging Face fixture: import a Kimi/DeepSeek-V3
architecture HF checkpoint, take its tokenizer, 2 supervised warm-up steps from the imported
weights, 2 RL steps, then evaluate the RL workdir (`experiments.eval`). CI size: a 1-layer model,
one device, the pod's tools and thinking mode, 384-token turns (a random policy writes no call,
so no episode is graded and no sandbox is needed)."""

import json

import jax
import numpy as np
import pytest

from composer_jax.codetasks import task as task_lib
from composer_jax.data import tokenizer as tok_lib
from composer_jax.hf import importer, writer
from composer_jax.model import config as model_config
from composer_jax.model import transformer
from composer_jax.train import load_checkpoint
from composer_jax.train.metrics import read_metrics
from experiments import eval as eval_cli
from experiments.coding import program
from experiments.configs import base, rl_coding
from tests.envs.coding.agent.append_test import deletion_task

CFG = model_config.get_preset("tiny", num_layers=1, max_position_embeddings=4096)


@pytest.mark.slow
def test_pod_imports_warms_up_trains_and_evaluates(tmp_path):
  hf = tmp_path / "hf"
  variables = jax.tree.map(np.asarray, transformer.init(CFG, jax.random.key(0)))
  flat = {
    tuple(k.key for k in kp): v for kp, v in jax.tree_util.tree_flatten_with_path(variables)[0]
  }
  writer.export_hf(CFG, flat.__getitem__, str(hf), dtype="float32")
  tok_lib.write_byte_ranks(str(hf / "tiktoken.model"))
  imported = tmp_path / "imported"
  importer.import_to_checkpoint(str(hf), str(imported))
  tasks_file = tmp_path / "tasks.jsonl"
  task_lib.write_jsonl(tasks_file, [deletion_task("pkg-t1"), deletion_task("pkg-t2")])

  c = rl_coding.get_config("pod")
  c.model = model_config.as_config(CFG)
  base.set_layout(c, "single")
  c.train.update(init_from=str(imported), steps=2, ckpt_every=1)
  c.env.update(
    tasks=str(tasks_file),
    tokenizer=str(hf),
    heldout_fraction=0.0,
    workers=1,
    backend="local",
    max_turns=3,
  )  # room for the oracle turn's reply
  c.env.curriculum.min_rollouts = 0
  c.rl.update(
    groups=1,
    group_size=2,
    seq_len=0,
    prompt_len=0,
    teacher_seq_len=0,
    max_new_tokens=384,
    teacher_rows=2,
  )  # the oracle edit turn fits
  c.loss.vocab_chunk_size = 512
  c.warmup.update(
    steps=2, batch_size=2, seq_len=2048, log_every=1, ckpt_every=1, check_every=2, check_tasks=1
  )
  c.warmup.optim.update(total_steps=2, warmup_steps=0)
  workdir = tmp_path / "run"
  records = program.run(c, str(workdir))

  assert [r["step"] for r in read_metrics(str(workdir / "warmup"))] == [1, 2]
  assert [r["step"] for r in records] == [1, 2] and all(r["grad_norm"] > 0 for r in records)
  # The warm-up started from the imported weights: step 1's loss is the imported model's.
  assert np.isfinite(read_metrics(str(workdir / "warmup"))[0]["ce"])
  _, warm = load_checkpoint.load(str(workdir / "warmup"))
  assert not np.array_equal(
    jax.tree.leaves(warm["params"])[0], jax.tree.leaves(variables["params"])[0]
  )
  rc = eval_cli.run(  # the settings: the RL workdir's own saved run config
    [
      f"--tasks={tasks_file}",
      f"--checkpoint={workdir}",
      "--split=all",
      "--k=1",
      "--config.rl.temperature=0.0",
      f"--out={tmp_path / 'eval'}",
    ]
  )
  assert rc == 0
  report = json.loads((tmp_path / "eval" / "eval.json").read_text())
  summary, played = report["summary"], report["meta"]["settings"]
  assert summary["episodes"] == 2 and summary["pass@1"] == 0.0
  assert played["env"]["tools"] == list(c.env.tools) and played["env"]["thinking"] is True
  assert played["env"]["max_turns"] == 3 and played["rl"]["temperature"] == 0.0
