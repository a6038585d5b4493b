"""Synthetic coding tasks: delete a tested feature from a real project, grade re-implementations.

Pipeline (SWE-smith style, with the doors seen at scale closed):
  sources   pinned sdists (third_party/coding_sources.json), fetched with pip, sha256-checked;
            dependencies as pinned wheels in a read-only runtime cached by hash
  microprojects  seeded generated packages of small pure functions with tests (manifest
            entries {"kind": "micro", "seed": S}): laptop-scale tasks through the same pipeline
  testmap   one sandboxed pytest run with a coverage context per test -> tests <-> symbols
  deletion  libcst removal of a feature + dead helpers/imports/__all__/re-exports/.pyi stubs
  bug_injection  one mutation of covered code (operator, condition, off-by-one, branch, args)
  generator FAIL_TO_PASS / PASS_TO_PASS validation over re-runs, direct vs collateral tests,
            task records (task.Task) with difficulty fields (difficulty.py; dedup)
  factory   every manifest project on a worker pool (workers.py: processes or Ray), resumable
  hiding    FAIL_TO_PASS tests removed from the visible workspace
  scrub     caches, bytecode, build outputs, prose, fresh single-commit git, leak scan
  grader    patch -> monitor -> fresh copy, tests/config reset -> two harness runs -> reward
  sandbox   bubblewrap: namespaces, uid 1000, no caps, seccomp, quota'd tmpfs, rlimits
  harness   in-sandbox pytest driver: HMAC-authenticated outcome channel, integrity check
  monitor   reward-hacking rules over the code of a change (AST) and an agent's commands
  curriculum pass-rate pool that retires trivial/impossible tasks, admits easy -> hard by
            difficulty, and asks for harder ones
  agent_tools    the agent's tools over a task workspace (list/read/search/edit/write/run/
            submit), sandboxed commands, budgets; bad input becomes an observation
  agent_episode  one model turn's calls applied; the end of an episode judged (monitor, grader)
  agent_env      CodingEnv: the rl.env.Env plug-in (Kimi K2 chat format, tool calls, reward)
  agent_feedback feedback kinds for coding behaviour (flagged turns + hints)
  split     train / held-out tasks by project (a hash of the project's name)
  evaluate  a policy on tasks: pass@k and behaviour per episode; JSON, CSV and PNG reports
            (the CLI is `python -m experiments.eval`)
CLIs: `python -m composer_jax.envs.coding.make_tasks` and `python -m composer_jax.envs.coding.grade`.
"""
