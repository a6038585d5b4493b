"""Shared assertions on lists of episode results (`composer_jax.rl.episodes`)."""

import numpy as np


def assert_same_episodes(a, b) -> None:
  """Same token ids, sampler log-probs, rewards and end states, episode by episode."""
  for x, y in zip(a, b, strict=True):
    np.testing.assert_array_equal(x.trajectory.tokens, y.trajectory.tokens)
    np.testing.assert_array_equal(x.trajectory.sampler_logprobs, y.trajectory.sampler_logprobs)
    assert x.trajectory.reward == y.trajectory.reward and x.state == y.state


def assert_some_episode_differs(a, c) -> None:
  """At least one episode's token ids differ (length or content)."""
  assert any(
    len(x.trajectory.tokens) != len(z.trajectory.tokens)
    or (x.trajectory.tokens != z.trajectory.tokens).any()
    for x, z in zip(a, c, strict=True)
  )
