"""Synthetic coding tasks: delete a tested feature from a real project, grade re-implementations.

One sub-package per concept (SWE-smith style pipeline, with the doors seen at scale closed):
  tasks/      task synthesis: pinned sources and generated micro-projects, test map, feature deletion and bug injection,
              validation (generator), hiding, scrubbing + leak scan, difficulty, the factory
              (`python -m composer_jax.envs.coding.tasks.make_tasks`), curriculum, split
  sandbox/    running untrusted code: bubblewrap + seccomp (the package itself), the in-sandbox
              pytest harness, the suite runner, the grader
              (`python -m composer_jax.envs.coding.sandbox.grade_patch`)
  monitor/    reward-hacking rules over the code of a change (AST) and an agent's commands
  agent/      the coding agent as an RL environment: tools over a workspace, one turn's calls,
              CodingEnv (the rl.env.Env plug-in), feedback kinds, scripted agents
  evaluation/ a policy on tasks: pass@k and behaviour per episode (CLI: `experiments/eval.py`)
Shared by all of them:
  task      task records (JSONL) and unified diffs
  project   a Python project tree: source and test files, packing a workspace
  workers   worker pools (local processes or Ray) for generation, grading and episodes
  cli       the commands' dialect: absl flags, one-line flag errors (exit 2), ranges and
            output paths checked at parse time, progress lines with an ETA
"""
