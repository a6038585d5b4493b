"""Checkpoint conversion CLIs: Hugging Face <-> composer_jax (`import_hf`, `export_hf`), and the
output-directory discipline they (and `experiments/eval.py`) share (`outputs`)."""
