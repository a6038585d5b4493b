"""Tool declarations as Kimi K2.5 writes them: a TypeScript-style `namespace functions`.

K2.5's tokenizer turns the OpenAI-style tool list into the text of its `tool_declare` turn
(`tools_ts_str`; third_party/README.md). For a tool `read(path: string, n?: integer)`:

    # Tools

    ## functions
    namespace functions {
    // Read a file.
    type read = (_: {
      path: string,
      n?: number
    }) => any;
    }

Rules (each checked against the released encoder's output in tests/chat/tools_ts_test.py):
required fields first, then optional ones (`?`), each group by name; descriptions and
constraints (`// maxLength: 5`) and defaults (`// Default: ...`) as comment lines above a
field; `integer` -> `number`; enums as `"a" | "b"`, `anyOf` and type lists as unions; arrays as
`Array<T>` (an element with comments on its own lines); `additionalProperties` as
`[k: string]: T`. `$ref`/`$defs` are not supported (one-line ValueError).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

_INDENT = "  "
_CONSTRAINTS = {
  "string": ("maxLength", "minLength", "pattern"),
  "number": ("maximum", "minimum"),
  "integer": ("maximum", "minimum"),
  "array": ("minItems", "maxItems"),
}
_UNION_NAMES = {
  "string": "string",
  "number": "number",
  "integer": "number",
  "boolean": "boolean",
  "null": "null",
  "object": "{}",
  "array": "Array<any>",
}


def deep_sorted(value):
  """`value` with every mapping's keys sorted, recursively (lists keep their order), as K2.5's
  tokenizer prepares `tools` before rendering."""
  if isinstance(value, Mapping):
    return {k: deep_sorted(value[k]) for k in sorted(value)}
  if isinstance(value, list | tuple):
    return [deep_sorted(v) for v in value]
  return value


def _comment(text: str, indent: str = "") -> str:
  return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


def _kind(schema) -> str:
  """Which rule renders `schema`: any, null, anyOf, enum, union, object, array or scalar."""
  if isinstance(schema, bool):
    return "any" if schema else "null"
  if not isinstance(schema, Mapping):
    raise ValueError(f"tool schema {schema!r} is not a JSON Schema object")
  if "$ref" in schema or "$defs" in schema:
    raise ValueError(f"tool schema {dict(schema)!r}: $ref/$defs are not supported")
  if "anyOf" in schema:
    return "anyOf"
  if "enum" in schema:
    return "enum"
  if "type" in schema:
    t = schema["type"]
    return "union" if isinstance(t, list) else t if t in ("object", "array") else "scalar"
  if not schema:
    return "any"
  raise ValueError(f"tool schema {dict(schema)!r} has no type, enum or anyOf")


def _docstring(schema, indent: str) -> str:
  """Comment lines (each ending in a newline) above a field: description, then constraints."""
  if not isinstance(schema, Mapping):
    return ""
  lines = [_comment(schema["description"], indent)] if schema.get("description") else []
  kind = _kind(schema)
  allowed = _CONSTRAINTS.get(schema.get("type"), ()) if kind in ("scalar", "array") else ()
  constraints = sorted((k, v) for k, v in schema.items() if k in allowed)
  if constraints:
    lines.append(f"{indent}// " + ", ".join(f"{k}: {v}" for k, v in constraints))
  return "".join(line + "\n" for line in lines)


def _type(schema, indent: str = "") -> str:
  """The TypeScript type of a JSON Schema, its inner lines indented by `indent`."""
  kind = _kind(schema)
  if kind in ("any", "null"):
    return kind
  if kind == "anyOf":
    return " | ".join(_type(s, indent) for s in schema["anyOf"])
  if kind == "enum":
    return " | ".join(f'"{e}"' if isinstance(e, str) else str(e) for e in schema["enum"])
  if kind == "union":
    return " | ".join(_UNION_NAMES[t] for t in schema["type"])
  if kind == "object":
    return _object(schema, indent)
  if kind == "array":
    item = schema.get("items") or {}
    doc = _docstring(item, indent + _INDENT)
    if doc:
      return f"Array<\n{doc}{indent}{_INDENT}{_type(item, indent + _INDENT)}\n{indent}>"
    return f"Array<{_type(item, indent)}>"
  return "number" if schema["type"] == "integer" else schema["type"]


def _field(name: str, schema, optional: bool, indent: str) -> str:
  doc = _docstring(schema, indent)
  default = schema.get("default") if isinstance(schema, Mapping) else None
  if default is not None:
    shown = (
      repr(default)
      if isinstance(default, int | float | bool)
      else json.dumps(default, ensure_ascii=False)
    )
    doc += f"{indent}// Default: {shown}\n"
  return f"{doc}{indent}{name}{'?' if optional else ''}: {_type(schema, indent)}"


def _object(schema: Mapping, indent: str = "") -> str:
  props = schema.get("properties") or {}
  required = set(schema.get("required") or ())
  order = sorted(n for n in props if n in required) + sorted(n for n in props if n not in required)
  fields = [_field(n, props[n], n not in required, indent + _INDENT) for n in order]
  extra = schema.get("additionalProperties")
  if extra is not None:
    shown = {True: "any", False: "never"}.get(extra) if isinstance(extra, bool) else None
    fields.append(f"{indent}{_INDENT}[k: string]: {shown or _type(extra, indent + _INDENT)}")
  return "{\n" + ",\n".join(fields) + f"\n{indent}}}" if fields else "{}"


def _function(function: Mapping) -> str:
  params = _object(function.get("parameters") or {})
  lines = [_comment(function["description"])] if function.get("description") else []
  return "\n".join([*lines, f"type {function.get('name', 'function')} = (_: {params}) => any;"])


def tools_ts(tools: Sequence[Mapping[str, Any]]) -> str:
  """The `tools_ts_str` of OpenAI-style declarations (`{"type": "function", "function":
  {name, description, parameters}}`); tools of other types are skipped, as K2.5 does."""
  functions = [
    _function(t["function"])
    for t in deep_sorted(list(tools))
    if t.get("type") == "function" and t.get("function")
  ]
  if not functions:
    return ""
  return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"
