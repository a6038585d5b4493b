"""The coding agent as an RL environment, over the tasks of `composer_jax.codetasks`.

  agent/      tools over a workspace, one turn's calls, CodingEnv (the rl.env.Env plug-in),
              feedback kinds, scripted agents
  evaluation/ a policy on tasks: pass@k and behaviour per episode (CLI: `experiments/eval.py`)
Tasks, the sandbox, the grader and the monitor live in `composer_jax.codetasks` (JAX-free).
"""
