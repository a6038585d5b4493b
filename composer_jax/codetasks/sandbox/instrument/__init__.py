"""Per-grade rewriting of the hidden FAIL_TO_PASS tests, so that no outcome the candidate's
process reports decides a grade on its own (host side; the sandbox half is in harness.py and
site_values.py).

Every FAIL_TO_PASS test function the grader can locate (module level or a method of a
module-level class of its file — or, one its file imports or inherits, the definition among
the modules beside it that Python would run: the one function of that name, or the method by
the class's method resolution order over its ancestors at any depth and across those modules
(hierarchy.mro) — defined once, not a generator or coroutine) is
rewritten in the graded copy of the file that defines it, fresh for every grade:

- **renamed**: a random token goes inside its name (`test_hypot` -> `test_k3q9_hypot`;
  prefix and suffix patterns such as `test*` / `*_test` still match), so the names the
  problem statement lists exist nowhere in the run. Collected ids are mapped back here. A
  name the file uses again is kept: such a function is protected by hidden sites alone. So
  is one that ids of another file run (a function or class imported or inherited there)
  where it has hidden sites; one without is renamed together with every such id, its decoys
  listed under each class that runs it, if every such id runs this definition and no other
  file names it (an override, a call, a string would name nothing after the rename). One
  without hidden values whose name other classes define too (an unrelated class's method, an
  override of it, one it overrides; in its file or another) is renamed with exactly the ids
  that run it by their classes' MROs, the others keeping their names, if the name occurs
  nowhere but in function definitions, every id of that name is known to run one definition
  and nothing on those MROs or in those modules is dynamic (hierarchy.rename_blocker: a base
  that is not a plain import, a metaclass, a star import, a name computed at run time ...);
  else it is kept, and unprotected, the reason naming what stopped the rename.
- **hidden sites**: each `assert A == <literal>` (either side; `unittest`'s assertEqual
  family; `pytest.approx(<literal>, rel=..., abs=...)`; a local bound once to a literal and
  used only as the expected side, which then binds None), and each truth, identity or order
  check (`assert A`, `assert not A`, `assert A is [not] None|True|False`, `assert A <op>
  <literal>` for != < <= > >= in / not in, assertTrue / assertFalse / assertIsNone /
  assertIsNotNone) that is not inside try/with or a nested scope becomes `S(id, A)`: the
  harness sends A's one canonical reading (site_values.py) and the host judges it against
  the literal and the operator, neither of which is in the sandbox at all. A site that is a
  top-level statement before any `return` is *required*: a run of the test that did not
  report it failed. Expected values that are not in the process cannot be read, lied to or
  forged; the rewritten file does not even say which checks expect true.
- **decoys**: a function without a required site gets `k` copies under other random names
  whose expected values are perturbed (parametrize columns, fixtures compared with `==`). A
  correct solution fails every decoy; a passing decoy means tampering. The plan records such
  functions (`Plan.decoyed`), and the grader does not grade them (grader.unprotected): their
  expected values stay in the process, and so does whatever tells the perturbed copies from
  the original (their values and tables, their lines at the end of the file), so an outcome
  forced on the real test alone cannot be excluded. A function with no comparison reached
  for sure that a decoy could perturb gets none (unprotected: the pass would be the
  process's word).
- **sentinels**: every file of FAIL_TO_PASS tests gets a test that always fails, run among
  them: it passes only if outcomes are forced for every test.

Line numbers of the original code do not move: renames and sites are spliced in place (sites
pad with newlines inside their parentheses) and decoys and sentinels are appended at the end
of the file. Which items are decoys never enters the sandbox: the items run in the order of
the command line, a permutation drawn host-side for each grade (`Plan.run_order`).

A function is protected when its pass is judged by what the process cannot know: required
hidden sites. Every other FAIL_TO_PASS function (not located, defined twice, a generator, a
kept name without a hidden value, guarded by decoys alone, nothing to compare) is listed
with why (`Plan.unprotected`, `Plan.decoyed`); the grader refuses to grade such a task and
the factory never emits one (grader.unprotected), since its pass would be the candidate's
process's word alone.

Files: rewrite.py (the plan of a grade: renames, sites, which protection each function gets),
hierarchy.py (which definition a test id runs, by the classes' MROs across files, and when a
shared name can be renamed),
shape.py (reading test functions: where defined, `==` checks against literals, parametrize),
hidden_tables.py (parametrized expected values swapped for tokens), decoys.py (perturbed
copies), splices.py (byte-range edits that keep line numbers), record.py (what the host
keeps: Plan, Site, id mapping, the host-side comparison).
"""

from composer_jax.codetasks.sandbox.instrument.record import Plan, Site, matches, split_id
from composer_jax.codetasks.sandbox.instrument.rewrite import plan, renamed

__all__ = ["Plan", "Site", "matches", "plan", "renamed", "split_id"]
