"""parallel.backend: a backend that fails to start is one line, not a traceback."""

import jax
import pytest

from composer_jax.parallel import backend


def test_a_backend_that_fails_to_start_is_one_line(monkeypatch):
  def fail():
    raise RuntimeError("Unable to initialize backend 'cuda': no devices\nmore detail")

  monkeypatch.setattr(jax, "devices", fail)
  with pytest.raises(
    SystemExit, match=r"^error: JAX could not start its backend .*no devices; set"
  ):
    backend.start_or_exit()
