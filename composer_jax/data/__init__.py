"""Local text corpora tokenized, packed and batched with grain (see pipeline.py)."""

from composer_jax.data.pipeline import default_config, make_iterator
from composer_jax.data.tokenizer import find_tokenizer_near, load_tokenizer

__all__ = ["default_config", "find_tokenizer_near", "load_tokenizer", "make_iterator"]
