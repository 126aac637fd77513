"""What a submission's source says about tampering, read without running it.

The grader (``inferlab.course.grade``) runs its own checks, so a notebook that rewrites the
checks it imported changes no verdict. It still deserves a look, and so does a notebook that
patches any module it imported (``math.isclose = ...`` would fool a check in the same process).
``source_flags(sources)`` parses every code cell (IPython syntax included) and reports each
statement that assigns or deletes an attribute of an imported module or of a name imported from
one, calls ``setattr``/``delattr`` on one, or writes into ``sys.modules``: the cell, the
statement, and what it touches.
"""

from __future__ import annotations

import ast
import re

CHECKS = "inferlab.course.checks"


def _python(source: str) -> str:
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(source)
    except Exception:  # no IPython, or a cell it cannot transform
        return source


def _dotted(node) -> list[str] | None:
    """``["check", "ridge_point"]`` for ``check.ridge_point``; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _imports(tree, bound: dict[str, str]) -> None:
    """Record the names an import statement binds, with the dotted path each stands for."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    bound[a.asname] = a.name
                else:
                    bound[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name != "*":
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"


def _kind(path: str) -> str:
    if path == CHECKS or path.startswith(CHECKS + "."):
        return "rebinds checks"
    if path.startswith("inferlab"):
        return "patches inferlab"
    return "patches a module"


def _targets(node) -> list:
    if isinstance(node, ast.Assign):
        out = []
        for t in node.targets:
            out += list(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else [t]
        return out
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _touched(node, bound: dict[str, str]) -> str | None:
    """The dotted path a statement or call rewrites, if it belongs to an imported name."""
    for target in _targets(node):
        if isinstance(target, ast.Subscript):  # sys.modules[...] = ..., vars(m)[...] = ...
            inner = target.value
            if isinstance(inner, ast.Call) and getattr(inner.func, "id", "") == "vars" and inner.args:
                inner = inner.args[0]
            elif isinstance(inner, ast.Attribute) and inner.attr == "__dict__":
                inner = inner.value
            parts = _dotted(inner)
            if parts and parts[0] in bound and (parts[-1] == "modules" or inner is not target.value):
                return ".".join([bound[parts[0]], *parts[1:]])
        parts = _dotted(target) if isinstance(target, ast.Attribute) else None
        if parts and parts[0] in bound:
            return ".".join([bound[parts[0]], *parts[1:]])
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("setattr", "delattr") \
            and node.args:
        parts = _dotted(node.args[0])
        if parts and parts[0] in bound:
            name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                else "<name>"
            return ".".join([bound[parts[0]], *parts[1:], str(name)])
    return None


def source_flags(cells: list[tuple[int, str]]) -> list[dict]:
    """``[{"cell", "kind", "message"}]``, one per cell and kind, for the statements that
    rewrite an imported module (or a name imported from one).

    ``cells`` are ``(index, source)`` pairs of the notebook's code cells, in order; a cell that
    does not parse is skipped (the run reports its error).
    """
    bound: dict[str, str] = {}
    flags = []
    for index, source in cells:
        try:
            tree = ast.parse(_python(source))
        except SyntaxError:
            continue
        _imports(tree, bound)
        found: dict[str, list[str]] = {}
        for node in ast.walk(tree):
            path = _touched(node, bound)
            if path is not None:
                text = re.sub(r"\s+", " ", ast.unparse(node))
                text = text if len(text) <= 60 else text[:57] + "..."
                found.setdefault(_kind(path), []).append(f"`{text}` ({path})")
        for kind, statements in found.items():
            what = {"rebinds checks": "rewrites the checks it imported; the grader runs its own "
                                      "copy of them, so this changes no verdict",
                    "patches inferlab": "rewrites part of inferlab that the checks may use",
                    "patches a module": "rewrites an imported module, which code in the same "
                                        "process (the checks too) may rely on"}[kind]
            shown = "; ".join(statements[:3]) + (f"; and {len(statements) - 3} more"
                                                  if len(statements) > 3 else "")
            flags.append({"cell": index, "kind": kind, "message": f"{shown}: {what}",
                          "paths": [s.rsplit("(", 1)[1].rstrip(")") for s in statements]})
    return flags
