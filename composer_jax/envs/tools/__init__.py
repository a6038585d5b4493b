"""A tool-calling environment for RL with targeted text feedback.

  vocab     word-level vocabulary (tools in alias pairs that serve one capability)
  env       ToolEnv: random tool subset + task per episode, tool-not-found errors, task reward
  feedback  feedback kinds (unavailable tool, over-long message) -> rl.teacher.DistillTarget
  warmup    scripted episodes for the supervised format warm-up
The episode runner is `composer_jax.rl.episodes`; the training program `composer_jax.rl.train`.
"""
