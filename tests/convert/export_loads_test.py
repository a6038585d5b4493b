"""An export loads and generates in transformers: `AutoTokenizer` and
`AutoModelForCausalLM.from_pretrained(out)` on the folder `export_hf` wrote, id for id with our
tokenizers and our model."""

import base64
import json
import os

import grain
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.data import tokenizer as tokenizer_lib
from composer_jax.hf import tokenizer_files
from composer_jax.model import transformer
from composer_jax.train import checkpointing
from tests.hf import helpers

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TEXT = "def main():\n    return x's 12345 + ÿé中文 [EOS] <|eos|>\n"


def test_exported_workdir_loads_and_generates_in_transformers(tmp_path):
  variables = helpers.random_variables()
  workdir = str(tmp_path / "wd")
  ckpt = checkpointing.Checkpointer(workdir, keep=1)
  run_config = {"method": "lm", "data": {"tokenizer": "byte"}}  # the default run's
  ckpt.save(
    1, variables, iter(grain.MapDataset.range(4).to_iter_dataset()), helpers.CFG, run_config
  )
  ckpt.close()
  out = str(tmp_path / "hf")
  proc = helpers.run_python(
    "-m", "composer_jax.convert.export_hf", f"--ckpt={workdir}", f"--out={out}", "--dtype=float32"
  )
  assert proc.returncode == 0, proc.stderr
  assert set(tokenizer_files.FILES) <= set(os.listdir(out))

  tok = transformers.AutoTokenizer.from_pretrained(out)
  # Our tokenizers read special-token names in text as plain text; transformers does with
  # `split_special_tokens` (by default it maps them to their ids, as for serving).
  ids = tok.encode(TEXT, add_special_tokens=False, split_special_tokens=True)
  assert ids == list(TEXT.encode("utf-8"))
  assert tok.decode(ids) == TEXT
  assert tok.encode("a<|eos|>", add_special_tokens=False) == [97, 257]
  assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (256, 257, 258)

  model = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
  assert model.generation_config.eos_token_id == 257 and not model.generation_config.do_sample
  prompt = tok("def f(x):", return_tensors="pt")
  with torch.no_grad():
    generated = model.generate(**prompt, max_new_tokens=4, min_new_tokens=4)
  n = prompt["input_ids"].shape[1]
  assert generated.shape == (1, n + 4)
  assert generated[0, :n].tolist() == prompt["input_ids"][0].tolist()
  # Greedy: the first new token is the argmax of our own model's logits on the prompt.
  hidden, _ = transformer.forward(
    helpers.CFG, variables, jnp.asarray(prompt["input_ids"].numpy(), jnp.int32)
  )
  logits = hidden[0, -1] @ transformer.output_head(helpers.CFG, variables["params"])
  assert int(generated[0, n]) == int(np.argmax(logits))
  assert isinstance(tok.decode(generated[0, n:]), str)


def test_tiktoken_tokenizer_converts_id_for_id(tmp_path):
  """A tiktoken file with merges (and Kimi's special tokens and regex) encodes the same in
  transformers as in `data.tokenizer`."""
  tokens = [bytes([b]) for b in range(256)] + [b"de", b"def", b"  ", b"    ", b"re", b"ret", b"12"]
  path = tmp_path / "tiktoken.model"
  path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens)))
  ours = tokenizer_lib.TiktokenTokenizer(str(path))
  out = tmp_path / "tok"
  out.mkdir()
  tokenizer_files.write_tokenizer(ours, str(out))
  tok = transformers.AutoTokenizer.from_pretrained(str(out))
  expected = ours.encode(TEXT)
  assert 257 in expected and 261 in expected  # merged tokens: "def", "ret"
  assert tok.encode(TEXT, add_special_tokens=False, split_special_tokens=True) == expected
  assert tok.convert_tokens_to_ids("<|im_end|>") == ours.special_tokens["<|im_end|>"]
  assert tok.eos_token_id == ours.eos_id and tok.pad_token_id == ours.pad_id
  assert (out / "tiktoken.model").read_bytes() == path.read_bytes()
  with open(out / "generation_config.json") as f:
    assert json.load(f)["eos_token_id"] == ours.eos_id
