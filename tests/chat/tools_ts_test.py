"""K2.5's TypeScript tool declarations: ours equal the released encoder's output.

kimi_k25_tools_ts.json holds tool lists and, for each, what Kimi K2.5's released
`tool_declaration_ts.encode_tools_to_typescript_style` printed for them after its tokenizer's
`deep_sort_dict` (how it was made: the file's `_source`; third_party/README.md): our agent's
tools, and schemas using every JSON Schema feature the encoder renders.
"""

import json
import os

import pytest

from composer_jax.chat import tools_ts
from composer_jax.chat.tools_ts import deep_sorted

CASES = json.load(open(os.path.join(os.path.dirname(__file__), "data", "kimi_k25_tools_ts.json")))[
  "cases"
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_equals_the_released_encoder(case):
  assert tools_ts(case["tools"]) == case["expected"]
  # The key order of the input does not matter (the tokenizer sorts keys first).
  reversed_keys = json.loads(json.dumps(case["tools"]), object_pairs_hook=lambda kv: dict(kv[::-1]))
  assert tools_ts(reversed_keys) == case["expected"]


def test_no_tools_is_empty():
  assert tools_ts([]) == "" and tools_ts([{"type": "_plugin", "_plugin": {}}]) == ""


def test_deep_sorted_sorts_keys_not_lists():
  assert (
    json.dumps(deep_sorted({"b": [{"d": 1, "c": 2}, 3], "a": 0}))
    == '{"a": 0, "b": [{"c": 2, "d": 1}, 3]}'
  )


@pytest.mark.parametrize(
  "schema, match",
  [
    ({"$ref": "#/$defs/x"}, r"\$ref/\$defs are not supported"),
    ({"description": "no type"}, "has no type, enum or anyOf"),
  ],
)
def test_unsupported_schema_is_one_clear_error(schema, match):
  tool = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": schema}}},
  }
  with pytest.raises(ValueError, match=match):
    tools_ts([tool])
