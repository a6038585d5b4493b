"""RL + self-distillation on coding episodes (`CodingEnv`, Kimi K2 chat format).

    python -m composer_jax.envs.coding.make_tasks --source DIR_OR_PIN --out tasks.jsonl
    python -m experiments.run --config=experiments/configs/rl_coding.py \
        --config.env.tasks=tasks.jsonl

'cpu' (the default arg): the `tiny` model, random init, the 256-byte tokenizer written in the
workdir (`env.tokenizer='bytes'`, vocab 512) and four tools, so one step of 2 groups x 2
episodes runs on a laptop CPU: sampling with tools (`experiments/coding/program.py`), the
sandboxed harness and grader, the RL + SD update on turns the feedback kinds flag, metrics,
checkpoints (the curriculum's pass rates included) and bit-for-bit resume (`rl.run`). A
random policy writes no well-formed call, so it learns the format from the malformed-call
hints first.

'pod': the imported Kimi K2 checkpoint and its tokenizer, given by path:

    python -m experiments.run --config=experiments/configs/rl_coding.py:pod \
        --config.env.tasks=tasks.jsonl --config.train.init_from=/ckpt/kimi_k2_imported \
        --config.env.tokenizer=/ckpt/kimi_k2_imported/tiktoken.model

with the full tool set, long turns and the episode workers on Ray (`ray.init()` joins
$RAY_ADDRESS). The config is an overlay on `base.py`'s schema; `env` is this program's own:
tasks (JSONL), heldout_fraction / split_seed (RL trains only on the projects these do not hold
out: `envs.coding.split`, the split `python -m experiments.eval` evaluates with the same
values), tokenizer, tools, max_turns, wall_s, output_chars, command_s (a command's wall
clock), workers/backend (`workers.Pool` for episode steps), curriculum (`TaskPool` options;
min_rollouts 0 = off), source (the tasks' project: its generator makes harder variants of
tasks solved more often than easy_rate; '' = none) and source_options (its `generator.Config`
fields, as the tasks were made).
"""

import ml_collections

from experiments.configs import base

SETTINGS = ("cpu", "pod")


def get_config(arg=None):
  arg = arg or "cpu"
  if arg not in SETTINGS:
    raise ValueError(f"rl_coding setting {arg!r}; valid: {list(SETTINGS)}")
  c = base.get_base_config()
  c.program = "rl"
  c.env = ml_collections.ConfigDict(
    dict(
      name="coding",
      tasks="",
      tokenizer="bytes",
      tools=("read_file", "edit", "run", "submit"),
      max_turns=2,
      wall_s=600.0,
      output_chars=2000,
      command_s=30.0,
      workers=1,
      backend="local",
      curriculum=dict(min_rollouts=8, easy_rate=0.8, max_active=0),
      source="",
      source_options={},
      heldout_fraction=0.2,  # projects held out of RL for eval (`envs.coding.split`)
      split_seed=0,
    )
  )
  c.model.overrides = {"vocab_size": 512, "max_position_embeddings": 4096}
  c.train.update(dict(steps=20, log_every=1, ckpt_every=5, keep=2, seed=0))
  c.rl.update(
    dict(
      groups=2,
      group_size=2,
      seq_len=2048,  # the episode's token budget: prompt ~1.7k bytes + 2 turns and replies
      prompt_len=2048,
      max_new_tokens=32,
      teacher_seq_len=2304,  # prefix + hint (~300 bytes) + turn
      teacher_rows=4,
    )
  )
  c.rl.feedback_kinds = ("unavailable_tool", "malformed_call", "tests_or_outside", "effort")
  c.rl.feedback_options = {}
  c.optim.update(dict(name="adamw", adam_lr=3e-4, schedule="wsd", warmup_steps=0,
                      wsd_decay_fraction=0.0, grad_clip=1.0))
  c.loss.vocab_chunk_size = 512
  c.loss.teacher = "ema"
  if arg == "pod":
    c.model.preset = "kimi_k2"
    c.model.overrides = {}
    c.env.update(dict(tokenizer="", tools=("list_dir", "read_file", "search", "edit",
                                           "write_file", "run", "submit"),
                      max_turns=30, workers=64, backend="ray", command_s=120.0))
    c.env.curriculum.max_active = 512
    c.rl.update(dict(groups=64, group_size=8, seq_len=65536, prompt_len=65536,
                     max_new_tokens=8192, teacher_seq_len=65536, teacher_rows=256))
    c.rl.feedback_kinds = ("unavailable_tool", "malformed_call", "style", "overlong_message",
                           "tests_or_outside", "effort")
    c.loss.vocab_chunk_size = 8192
    base.set_layout(c, "fsdp_ep")
  return c
