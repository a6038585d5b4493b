"""Train / held-out split of coding tasks by project, so no held-out project is trained on.

Tasks made from one project share its code, tests and style; splitting tasks at random would
let training see the evaluation's projects. A project is held out when the hash of its name
(with a seed) falls in the lowest `fraction` of the hash range: a property of the project
alone, so the same projects are held out whatever task file, or other projects, they come
with, and RL (train split) and evaluation (held-out split) agree without sharing state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from composer_jax.codetasks.task import Task


def project_of(task: Task) -> str:
  """The project a task was made from (its source distribution's name)."""
  return task.source["name"]


def is_heldout(project: str, fraction: float, seed: int = 0) -> bool:
  """`sha256(f'{seed}:{project}')`, read as a number in [0, 1), is below `fraction`."""
  if not 0 <= fraction <= 1:
    raise ValueError(f"held-out fraction {fraction} must lie in [0, 1]")
  digest = hashlib.sha256(f"{seed}:{project}".encode()).digest()
  return int.from_bytes(digest, "big") < fraction * 2**256


def split_by_project(
  tasks: Sequence[Task], fraction: float, seed: int = 0
) -> tuple[list[Task], list[Task]]:
  """(train tasks, held-out tasks), held out by project (`is_heldout`)."""
  held = {p for p in {project_of(t) for t in tasks} if is_heldout(p, fraction, seed)}
  return (
    [t for t in tasks if project_of(t) not in held],
    [t for t in tasks if project_of(t) in held],
  )
