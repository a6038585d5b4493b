"""RL + self-distillation on coding episodes (`CodingEnv`, Kimi K2.5 chat format).

    python -m experiments.run --config=experiments/configs/rl_coding.py
    python -m experiments.run --config=experiments/configs/rl_coding.py \
        --config.env.tasks=tasks.jsonl    # python -m composer_jax.codetasks.synthesis.make_tasks ...

'cpu' (the default arg): micro-project tasks (`env.tasks='micro:0:8'`: made on first use,
`make_tasks.micro_tasks`), the `tiny` model,
random init, the 256-byte tokenizer (`env.tokenizer='bytes'`, vocab 512, kept as the
workdir's tiktoken.model for `python -m experiments.eval`) and four tools, so one step of 2
groups x 2 episodes runs on a laptop CPU: sampling with tools (`experiments/coding/
program.py`), the sandboxed harness and grader, the RL + SD update on turns the feedback kinds
flag, metrics, checkpoints (the curriculum's pass rates included) and bit-for-bit resume
(`rl.run`). Budgets fit the micro tasks: one 512-token turn holds a gold edit and the submit
call (their measured sizes: RESULTS.md, "Micro-project tasks").

Token lengths (`rl.seq_len`, `rl.prompt_len`, `rl.teacher_seq_len`) set to 0 are derived from
the tasks when the env is built, and every length is checked against the tasks and the model
there, one line each (`program.fit_lengths`): a real project's statements are longer, so
leave them at 0 or set what the line asks for.

'pod': the imported Kimi K2 checkpoint and its tokenizer, given by path:

    python -m composer_jax.convert.import_hf --hf_dir=/ckpt/Kimi-K2.5 --out=/ckpt/kimi_k2_imported
    python -m experiments.run --config=experiments/configs/rl_coding.py:pod \
        --config.env.tasks=tasks.jsonl --config.train.init_from=/ckpt/kimi_k2_imported

(the tokenizer: `tiktoken.model` beside the imported checkpoint, or
`--config.env.tokenizer=FILE`): a supervised warm-up on the tasks' oracle episodes
(`warmup.steps`, from the imported weights), then RL, in K2.5's thinking mode, with the full
tool set, long turns and the episode workers on Ray (`ray.init()` joins
$RAY_ADDRESS). The config is an overlay on `base.py`'s schema; `env` is this program's own:
tasks (a JSONL or micro:START:STOP), heldout_fraction / split_seed (RL trains only on the
projects these do not hold out: `codetasks.synthesis.split`, the split `python -m experiments.eval`
evaluates with the same values), tokenizer, tools, max_turns, wall_s, output_chars,
command_s (a command's wall clock), max_hint_tokens (hints are cut to it: a teacher row is
at most the history + this + the turn), workers/backend (`workers.Pool` for episode steps and
for making micro tasks), curriculum (`TaskPool` options; min_rollouts 0 = off), source (the
tasks' project: its generator makes harder variants of tasks solved more often than
easy_rate; '' = none), source_options (its `generator.Config` fields, as the tasks were
made), thinking (K2.5's thinking or instant mode), system (the system message; '' = the
agent's) and statement ('full' or 'compact': `CodingEnv`).

'micro': the learnable family at laptop scale (micro-project deletion tasks; the whole
experiment is `python -m experiments.coding.learn`): tools `append` + `submit` (a byte-level
tiny model writes a function, not text to match), instant mode, the compact statement, 3 turns,
a supervised warm-up (`warmup`: `experiments/coding/warmup.py`) before RL.

Arms (`base.parse_arg`: `SETTING,arm=ARM`, e.g. `micro,arm=rl`): 'sd' (default) RL + targeted
self-distillation on the turns the feedback kinds flag, teacher = the EMA policy with the hint
inserted (`loss.teacher`); 'rl' RL alone (`loss.sd_coef` 0: turns are still flagged and counted,
no teacher batch).
"""

import ml_collections

from composer_jax import optim
from composer_jax.model import config as model_config
from experiments.configs import base

SETTINGS = ("cpu", "pod", "micro")
ARMS = ("sd", "rl")  # RL + targeted self-distillation, or RL alone


def get_config(arg=None):
  arg = base.parse_arg(arg, setting="cpu", arm="sd")
  setting, arm = arg.setting, arg.arm
  if setting not in SETTINGS or arm not in ARMS:
    raise ValueError(
      f"rl_coding setting={setting!r}, arm={arm!r}; valid: setting in "
      f"{list(SETTINGS)}, arm in {list(ARMS)}"
    )
  arg = setting
  c = base.get_base_config()
  c.method = "rl"
  c.env = ml_collections.ConfigDict(
    dict(
      name="coding",
      tasks="micro:0:8",
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
      heldout_fraction=0.2,  # projects held out of RL for eval (`codetasks.synthesis.split`)
      split_seed=0,
      max_hint_tokens=384,
      thinking=False,
      system="",
      statement="full",
    )
  )
  # Supervised warm-up on the tasks' oracle episodes before RL (experiments/coding/warmup.py);
  # steps=0: none (RL from `train.init_from` or a random init).
  c.warmup = ml_collections.ConfigDict(
    dict(
      steps=0,
      batch_size=8,
      seq_len=2048,
      log_every=10,
      ckpt_every=50,
      check_every=50,
      check_tasks=4,
      keep=1,
      router_bias_rate=1e-3,
      only=False,
    )
  )  # only: no RL after it
  c.warmup.optim = optim.default_config()  # total_steps 0: the warm-up's steps
  c.warmup.optim.update(dict(name="adamw", adam_lr=3e-3, schedule="cosine", warmup_steps=10))
  c.model.update(dict(vocab_size=512, max_position_embeddings=4096))
  c.train.update(dict(steps=20, log_every=1, ckpt_every=5, keep=2, seed=0))
  c.rl.update(
    dict(
      groups=2,
      group_size=2,
      seq_len=0,  # derived from the tasks: longest prompt + max_turns * max_new_tokens
      prompt_len=0,  # derived: seq_len
      max_new_tokens=512,  # a micro task's gold edit + submit fits one turn (RESULTS.md)
      teacher_seq_len=0,  # derived: seq_len + env.max_hint_tokens
      teacher_rows=4,
    )
  )
  c.rl.feedback_kinds = ("unavailable_tool", "malformed_call", "tests_or_outside", "effort")
  c.rl.feedback_options = {}
  c.optim.update(
    dict(
      name="adamw",
      adam_lr=3e-4,
      schedule="wsd",
      warmup_steps=0,
      wsd_decay_fraction=0.0,
      grad_clip=1.0,
    )
  )
  c.loss.vocab_chunk_size = 512
  c.loss.teacher = "ema"
  if arg == "pod":
    c.model = model_config.preset_config("kimi_k2")
    c.env.update(
      dict(
        tasks="",
        tokenizer="",
        tools=("list_dir", "read_file", "search", "edit", "write_file", "run", "submit"),
        max_turns=30,
        workers=64,
        backend="ray",
        command_s=120.0,
        max_hint_tokens=512,
      )
    )
    c.env.curriculum.max_active = 512
    c.rl.update(
      dict(
        groups=64,
        group_size=8,
        seq_len=65536,
        prompt_len=65536,
        max_new_tokens=8192,
        teacher_seq_len=0,
        teacher_rows=256,
      )
    )
    c.rl.feedback_kinds = (
      "unavailable_tool",
      "malformed_call",
      "style",
      "overlong_message",
      "tests_or_outside",
      "effort",
    )
    c.loss.vocab_chunk_size = 8192
    c.env.thinking = True
    c.warmup.update(dict(steps=200, batch_size=64, seq_len=65536))
    base.set_layout(c, "fsdp_ep")
  if arg == "micro":
    # The learnable family (micro-project deletion tasks): short `append` calls, instant mode,
    # a 3-turn budget, the compact statement; a byte tokenizer: an oracle episode is 0.6-0.75k
    # tokens.
    c.env.update(
      dict(
        tools=("append", "submit"),
        max_turns=3,
        system="Fix it.",
        statement="compact",
        max_hint_tokens=128,
      )
    )
    c.env.curriculum.min_rollouts = 0
    c.model.max_position_embeddings = 1536
    c.train.update(dict(steps=8, log_every=1, ckpt_every=4))
    # The episode budget: prompt ~520 + append turn <= 256 + reply + room for a 256-token turn.
    c.rl.update(
      dict(
        groups=2,
        group_size=4,
        seq_len=1280,
        prompt_len=1280,
        max_new_tokens=256,
        teacher_seq_len=1408,
        teacher_rows=8,
      )
    )
    c.rl.feedback_kinds = ("unavailable_tool", "malformed_call")
    c.optim.adam_lr = 1e-4
    # Muon, 4 episodes of <= 768 tokens a step: per CPU second the cheapest warm-up that
    # learned the format; 800 steps: the first count whose greedy policy solves training
    # tasks (RESULTS.md, 2026-12-05, "Coding agent learns?").
    c.warmup.update(
      dict(
        steps=800,
        batch_size=4,
        seq_len=768,
        log_every=10,
        ckpt_every=50,
        check_every=100,
        check_tasks=8,
      )
    )
    c.warmup.optim.name = "muon"
  if arm == "rl":  # the turns are still flagged (and counted), no teacher batch is built
    c.loss.sd_coef = 0.0
  return c
