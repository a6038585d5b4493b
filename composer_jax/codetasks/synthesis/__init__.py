"""Task synthesis: a tested feature deleted, or a bug injected, in a real project, validated.

sources   pinned sdists (third_party/coding_sources.json), fetched with pip, sha256-checked;
          dependencies as pinned wheels in a read-only runtime cached by hash
microprojects  seeded generated packages of small pure functions with tests (manifest
          entries {"kind": "micro", "seed": S}): laptop-scale tasks through the same pipeline
testmap   one sandboxed pytest run with a coverage context per test -> tests <-> symbols
deletion  libcst removal of a feature + dead helpers/imports/__all__/re-exports/.pyi stubs
bug_injection  one mutation of covered code (operator, condition, off-by-one, branch, args)
generator FAIL_TO_PASS / PASS_TO_PASS validation over re-runs, direct vs collateral tests,
          task records (task.Task) with difficulty fields (difficulty.py; dedup)
hiding    FAIL_TO_PASS tests removed from the visible workspace (then sandbox.scrub: caches,
          build outputs, prose, fresh git, leak scan)
factory   every manifest project on a worker pool (workers.py: processes or Ray), resumable
make_tasks  the CLI (one source or a whole manifest)
curriculum pass-rate pool that retires trivial/impossible tasks, admits easy -> hard by
          difficulty, and asks for harder ones
split     train / held-out tasks by project (a hash of the project's name)
"""
