"""Running untrusted code (repository tests, model patches) and grading it; fails closed.

bwrap         one command in a bubblewrap sandbox: quotas, limits, no network (host side)
seccomp       the sandbox's seccomp filter
suite         a project's pytest suite in the sandbox through the harness
harness       the in-sandbox pytest driver; guard (PEP 578 audit hook), covplugin (a
              coverage context per test) and site_values run beside it inside the sandbox
dependencies  a project's pinned dependency runtime, laid into the tree a test run sees
instrument/   per-grade rewriting of FAIL_TO_PASS tests (renamed, hidden values, decoys)
scrub         the visible workspace scrubbed (caches, builds, prose, git) and leak-scanned
root_leaks    the leak scan of the sandbox root
grader        a candidate patch's grade (`python -m composer_jax.codetasks.sandbox.grade_patch`)
"""
