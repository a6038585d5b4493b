"""The coding agent as an RL environment (Kimi K2 chat format, tool calls, reward).

tools     the agent's tools over a task workspace (list/read/search/edit/write/run/submit),
          sandboxed commands, budgets; bad input becomes an observation
episode   one model turn's calls applied; the end of an episode judged (monitor, grader)
env       CodingEnv: the rl.env.Env plug-in
feedback  feedback kinds for coding behaviour (flagged turns + hints)
scripts   scripted agents (oracle, no-op, hacks) for tests, benches and warm-up data
"""
