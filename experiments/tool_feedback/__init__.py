"""The tool-calling experiment with targeted text feedback: a program over the `rl` library.

  program   the environment glue (`make_env`: `envs.toolcall.ToolEnv` from the config), the
            supervised warm-up on scripted episodes (`warmup`, saved once per workdir by
            `warmed_up`), and `run(config, workdir)`: warm-up, then RL through `rl.run`.
  sweep     every arm x seed x behaviour of the program, run (resumable), rows to
            text_feedback.csv; `arms`: the arm configs and the CSV rows it shares with the figure.
Its config is `experiments/configs/rl_tool_feedback.py`, its figure (plots the sweep)
`experiments/figures/text_feedback.py`.
"""
