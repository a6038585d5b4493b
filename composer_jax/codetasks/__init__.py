"""Coding tasks without JAX: synthesise tasks from real projects, run code in a sandbox, grade.

Ground floor of the library (beside `data/`): imports no JAX, numpy or other composer_jax
package, and its dependencies (libcst, coverage, pytest, bubblewrap, seccomp) come with the
`[coding]` extra. The coding agent that trains on these tasks (`envs/coding/`) sits above rl/.
  task        task records (JSONL) and unified diffs
  project     a Python project tree: source and test files, packing a workspace
  workers     worker pools (local processes or Ray) for generation, grading and episodes
  monitor/    reward-hacking rules over the code of a change (AST) and an agent's commands
  sandbox/    running untrusted code: bubblewrap + seccomp, the in-sandbox pytest harness, the
              suite runner, scrubbing + leak scan, the grader
              (`python -m composer_jax.codetasks.sandbox.grade_patch`)
  synthesis/  task synthesis: pinned sources and generated micro-projects, test map, feature
              deletion and bug injection, validation (generator), hiding, difficulty, the factory
              (`python -m composer_jax.codetasks.synthesis.make_tasks`), curriculum, split
"""
