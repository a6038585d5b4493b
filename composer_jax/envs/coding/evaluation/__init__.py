"""Evaluating a policy on coding tasks: pass@k and behaviour per episode (`evaluate`).

The CLI is `python -m experiments.eval`.
"""
