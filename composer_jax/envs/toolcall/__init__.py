"""A tool-calling environment for RL with targeted text feedback.

  vocab     word-level vocabulary (tools in alias pairs that serve one capability)
  env       ToolEnv: random tool subset + task per episode, tool-not-found errors, task reward
  feedback  feedback kinds (unavailable tool, over-long message): flagged turns and their hints
  warmup    scripted episodes for the supervised format warm-up
`ToolEnv` implements `composer_jax.rl.env.Env`; the episode runner is `composer_jax.rl.episodes`,
the experiment `experiments/tool_feedback`.
"""
