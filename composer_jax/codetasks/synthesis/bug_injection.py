"""Procedural bug injection: one small AST rewrite of covered code (libcst, formatting kept).

Mutation kinds (the classic mutation-testing operators, applied to lines the coverage map says
some test executed, inside one function or method body):
  operator          + <-> -, * <-> //, == <-> !=, < <-> >, <= <-> >=, in <-> not in,
                    is <-> is not, and <-> or
  condition         `if c:` / `elif c:` / `x if c else y` / `while c:` -> `not (c)`
  off_by_one        < <-> <=, > <-> >= in comparisons; an integer literal used as an index,
                    slice bound or range() argument + 1
  removed_branch    an `else`/`elif` branch dropped; an `if` without else (not alone in its
                    block) removed
  swapped_arguments the first two positional arguments of a call swapped (when they differ)
Sites are enumerated in source order, so (symbol, kind, index) names one mutation exactly.
"""

import dataclasses

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

KINDS = ("operator", "condition", "off_by_one", "removed_branch", "swapped_arguments")

_BIN_SWAP = {
  cst.Add: cst.Subtract,
  cst.Subtract: cst.Add,
  cst.Multiply: cst.FloorDivide,
  cst.FloorDivide: cst.Multiply,
}
_CMP_SWAP = {
  cst.Equal: cst.NotEqual,
  cst.NotEqual: cst.Equal,
  cst.LessThan: cst.GreaterThan,
  cst.GreaterThan: cst.LessThan,
  cst.LessThanEqual: cst.GreaterThanEqual,
  cst.GreaterThanEqual: cst.LessThanEqual,
  cst.In: cst.NotIn,
  cst.NotIn: cst.In,
  cst.Is: cst.IsNot,
  cst.IsNot: cst.Is,
}
_CMP_STRICT = {
  cst.LessThan: cst.LessThanEqual,
  cst.LessThanEqual: cst.LessThan,
  cst.GreaterThan: cst.GreaterThanEqual,
  cst.GreaterThanEqual: cst.GreaterThan,
}
_BOOL_SWAP = {cst.And: cst.Or, cst.Or: cst.And}
_SYMMETRIC = frozenset({"max", "min", "hash", "print", "set", "frozenset"})  # swaps change nothing


@dataclasses.dataclass(frozen=True)
class Mutation:
  kind: str
  line: int  # first line of the rewritten node
  before: str  # source of the node before and after (for logs and the leak scan)
  after: str
  new_code: str  # the whole mutated module


def _swap_op(op, table):
  new = table[type(op)]
  kw = {}
  for attr in ("whitespace_before", "whitespace_after"):
    if hasattr(op, attr) and attr in {f.name for f in dataclasses.fields(new)}:
      kw[attr] = getattr(op, attr)
  return new(**kw)


def _paren(expr):
  """`not` binds tighter than and/or/if-else/lambda/walrus: those need parentheses."""
  loose = (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr, cst.Comparison)
  if expr.lpar or not isinstance(expr, loose):
    return expr
  return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _negate(test):
  return cst.UnaryOperation(cst.Not(), _paren(test))


class _Sites(cst.CSTVisitor):
  """Collects (kind, old node, new node) for every mutation site on `lines`."""

  METADATA_DEPENDENCIES = (PositionProvider, ParentNodeProvider)

  def __init__(self, lines: set[int]):
    self.lines, self.sites = lines, []

  def _on(self, node) -> bool:
    return self.get_metadata(PositionProvider, node).start.line in self.lines

  def _add(self, kind, old, new):
    if self._on(old):
      self.sites.append((kind, old, new))

  def visit_BinaryOperation(self, node):
    if type(node.operator) in _BIN_SWAP:
      self._add("operator", node, node.with_changes(operator=_swap_op(node.operator, _BIN_SWAP)))

  def visit_BooleanOperation(self, node):
    self._add("operator", node, node.with_changes(operator=_swap_op(node.operator, _BOOL_SWAP)))

  def visit_Comparison(self, node):
    for i, target in enumerate(node.comparisons):
      for kind, table in (("operator", _CMP_SWAP), ("off_by_one", _CMP_STRICT)):
        if type(target.operator) in table:
          op = _swap_op(target.operator, table)
          comps = list(node.comparisons)
          comps[i] = target.with_changes(operator=op)
          self._add(kind, node, node.with_changes(comparisons=comps))

  def visit_Integer(self, node):
    parent = self.get_metadata(ParentNodeProvider, node)
    grand = self.get_metadata(ParentNodeProvider, parent, None)
    is_index = isinstance(parent, (cst.Index, cst.Slice))
    is_range = (
      isinstance(parent, cst.Arg)
      and isinstance(grand, cst.Call)
      and isinstance(grand.func, cst.Name)
      and grand.func.value == "range"
    )
    if is_index or is_range:
      self._add("off_by_one", node, cst.Integer(str(int(node.value, 0) + 1)))

  def visit_If(self, node):
    self._add("condition", node, node.with_changes(test=_negate(node.test)))
    if node.orelse is not None:
      self._add("removed_branch", node, node.with_changes(orelse=None))
    else:
      block = self.get_metadata(ParentNodeProvider, node)
      if isinstance(block, cst.IndentedBlock) and len(block.body) > 1:
        self._add("removed_branch", node, cst.RemoveFromParent())

  def visit_While(self, node):
    self._add("condition", node, node.with_changes(test=_negate(node.test)))

  def visit_IfExp(self, node):
    self._add("condition", node, node.with_changes(test=_negate(node.test)))

  def visit_Call(self, node):
    if isinstance(node.func, cst.Name) and node.func.value in _SYMMETRIC:
      return
    pos = [a for a in node.args if a.keyword is None and not a.star]
    if len(pos) >= 2 and len(pos) == len([a for a in node.args if not a.keyword]):
      a, b = pos[0], pos[1]
      if cst.Module([]).code_for_node(a.value) != cst.Module([]).code_for_node(b.value):
        args = list(node.args)
        i, j = args.index(a), args.index(b)
        args[i] = a.with_changes(value=b.value)
        args[j] = b.with_changes(value=a.value)
        self._add("swapped_arguments", node, node.with_changes(args=args))


def mutations(code: str, lines: set[int]) -> list[Mutation]:
  """Every single-site mutation of `code` whose node starts on one of `lines`."""
  wrapper = MetadataWrapper(cst.parse_module(code))
  visitor = _Sites(lines)
  wrapper.visit(visitor)
  mod = wrapper.module
  pos = wrapper.resolve(PositionProvider)
  out = []
  for kind, old, new in visitor.sites:
    new_code = mod.deep_replace(old, new).code
    if new_code == code:
      continue
    after = "" if isinstance(new, cst.RemovalSentinel) else mod.code_for_node(new)
    out.append(Mutation(kind, pos[old].start.line, mod.code_for_node(old), after, new_code))
  return out
