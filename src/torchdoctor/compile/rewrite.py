"""A data-dependent ``if`` on a tensor, rewritten without the branch (``torch.where``), as a diff.

Dynamo breaks the graph at a Python ``if`` whose condition is a tensor's value. When both
branches only assign tensor expressions to names (or both return one), the choice can be made
by the tensors themselves::

    if h.abs().max() > CLIP:            h = torch.where(h.abs().max() > CLIP,
        h = h.clamp(-CLIP, CLIP)    ->                  h.clamp(-CLIP, CLIP), h)

``torch.where`` evaluates both sides, so each side must be an expression without side effects:
calls on tensors, arithmetic, attribute reads; no assignment targets other than plain names, no
``print``/logging, no nested statements. Anything else gets no rewrite (the advice stays
torch.cond). The rewrite is generated from the user's source with ``ast`` (no torch, nothing run)
and printed as a unified diff against the file, never applied. ``check`` (torch, run by the
tool, not the job) validates it: both versions evaluated on fresh tensors for the names the
branch reads, with module-level literal constants, on inputs that take both branches, and the
rewritten one compiled with ``fullgraph=True``.
"""

from __future__ import annotations

import ast
import difflib
import os
from dataclasses import dataclass, field

_SIDE_EFFECTS = {"print", "setattr", "delattr", "exec", "eval", "open", "input", "__import__"}
_MAX_SOURCE = 1 << 20


@dataclass
class Rewrite:
    """A rewritten branch: the diff, and what ``check`` needs to validate it."""

    path: str
    line: int
    diff: str
    condition: str
    original: str  # the ``if`` statement, dedented
    rewritten: str  # its replacement, dedented
    names: list[str] = field(default_factory=list)  # tensor names the statement reads
    constants: dict[str, float | int | bool] = field(default_factory=dict)  # module-level literals it reads
    result: list[str] = field(default_factory=list)  # the names it assigns ("return" for a return)


def _pure(node: ast.AST) -> bool:
    """An expression without side effects we can see: no walrus, lambda, await, yield, calls of
    known side-effecting builtins, or logging methods."""
    for sub in ast.walk(node):
        if isinstance(sub, (ast.NamedExpr, ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom)):
            return False
        if isinstance(sub, ast.Call):
            f = sub.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in _SIDE_EFFECTS or name in ("debug", "info", "warning", "error", "log", "append", "extend",
                                                 "update", "pop", "add_", "copy_", "zero_", "fill_"):
                return False
            if name.endswith("_") and not name.startswith("_"):  # in-place tensor ops mutate their input
                return False
    return True


def _assignments(body: list[ast.stmt]) -> dict[str, ast.expr] | None:
    """name -> expression for a body of plain ``name = expr`` statements; None otherwise."""
    out: dict[str, ast.expr] = {}
    for stmt in body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and _pure(stmt.value)):
            return None
        name = stmt.targets[0].id
        if name in out or any(isinstance(n, ast.Name) and n.id in out for n in ast.walk(stmt.value)):
            return None  # a later line reads an earlier one: not a set of independent choices
        out[name] = stmt.value
    return out


def _branch(node: ast.If) -> tuple[list[str], list[str]] | None:
    """(result names, replacement lines) for a rewritable ``if``; None when it is not one."""
    if not _pure(node.test):
        return None
    cond = ast.unparse(node.test)
    body, orelse = node.body, node.orelse
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None and \
            len(orelse) == 1 and isinstance(orelse[0], ast.Return) and orelse[0].value is not None:
        a, b = body[0].value, orelse[0].value
        if _pure(a) and _pure(b):
            return ["return"], [f"return torch.where({cond}, {ast.unparse(a)}, {ast.unparse(b)})"]
        return None
    yes = _assignments(body)
    no = _assignments(orelse) if orelse else {}
    if not yes or no is None or (orelse and set(no) - set(yes)):
        return None
    lines = []
    for name, expr in yes.items():
        other = ast.unparse(no[name]) if name in no else name
        lines.append(f"{name} = torch.where({cond}, {ast.unparse(expr)}, {other})")
    return list(yes), lines


def _constants(tree: ast.Module) -> dict[str, float | int | bool]:
    """Module-level ``NAME = <number or bool literal>`` assignments."""
    out: dict[str, float | int | bool] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            v = stmt.value
            if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub) and isinstance(v.operand, ast.Constant):
                v = ast.Constant(-v.operand.value) if isinstance(v.operand.value, (int, float)) else v
            if isinstance(v, ast.Constant) and isinstance(v.value, (int, float, bool)):
                out[stmt.targets[0].id] = v.value
    return out


def rewrite(path: str, line: int) -> Rewrite | None:
    """The rewrite of the ``if`` at ``path:line``; None when there is none (or the file is unreadable)."""
    try:
        if os.path.getsize(path) > _MAX_SOURCE:
            return None
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source, filename=path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    node = next((n for n in ast.walk(tree) if isinstance(n, ast.If) and n.lineno == line), None)
    if node is None or node.end_lineno is None:
        return None
    got = _branch(node)
    if got is None:
        return None
    result, new = got
    lines = source.splitlines(keepends=True)
    indent = lines[node.lineno - 1][: len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())]
    replaced = [indent + text + "\n" for text in new]
    after = lines[: node.lineno - 1] + replaced + lines[node.end_lineno:]
    name = os.path.basename(path)
    diff = "".join(difflib.unified_diff(lines, after, fromfile=f"a/{name}", tofile=f"b/{name}", n=1))
    if not any(isinstance(n, ast.Import | ast.ImportFrom) and any((a.asname or a.name) == "torch" for a in n.names)
               for n in tree.body):
        diff += "# (and `import torch` at the top of the file)\n"
    module_consts = _constants(tree)
    read = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)})
    return Rewrite(
        path=path, line=line, diff=diff, condition=ast.unparse(node.test),
        original=ast.unparse(node), rewritten="\n".join(new),
        names=[n for n in read if n not in module_consts and n != "torch"],
        constants={n: module_consts[n] for n in read if n in module_consts}, result=result)
