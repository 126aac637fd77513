"""The grader's own checks, run inside a submission's kernel after the submission has finished.

``inferlab.course.runner`` executes a submitted notebook and then sends this file's text to the
same kernel as one last cell, which calls ``run(globals(), params)``. The verdict comes from here,
never from what the notebook printed:

1. **Fresh checks.** The lab's check module (``inferlab/course/checks/labNN.py``) and the module
   it builds on (``checks/__init__.py``) are executed anew from their files, into module objects
   the notebook has never seen, so rebinding ``check.ridge_point`` or ``checks.run_check`` in the
   notebook changes nothing here.
2. **The learner's own functions.** Every code cell of the submission that defines an exercise's
   name (``def``, ``class``, an assignment or an import) has its definitions executed again, in
   order, into a copy of the notebook's namespace. That gives the functions as the learner wrote
   them, even where a check cell later rebound the name to the package's reference (which a check
   hands back for an exercise not attempted yet).
3. **Each check, called by the grader.** An exercise passes only if the fresh check returns the
   learner's own function. Which reference a check lends is learned by asking it (a stub that
   raises ``NotImplementedError`` gets the reference back). A learner's function that *is* that
   reference, wraps it or subclasses it, or calls it (seen by a ``sys.settrace`` hook that watches
   for the reference's code being entered straight from the submission's code) is *flagged*, not
   passed; so are calls to the functions a reference wrapper names in ``same_as``.
4. **Tampering.** Every loaded ``inferlab`` module is compared with its source: a function or class
   the source defines that is now something else (``formulas.ridge_point = ...``, or a method of
   ``BlockTable`` replaced) is reported. A replaced oracle outside the check modules makes every
   verdict of the notebook untrustworthy, so its exercises are flagged.
5. **A private channel.** The results go to a file the grader created after the submission had
   finished, named only in this cell, together with a random nonce the grader checks.

Everything runs in the learner's process, so code written to subvert Python itself (patching the
interpreter, the standard library or torch) is out of reach; ``inferlab.course.scan`` also flags,
by reading the source, cells that assign to attributes of imported modules. The instructor guide
says what that does and does not guarantee. The file imports nothing from ``inferlab``, and is
longer than the package's other modules for that reason: in the kernel, anything it imported
from there would come from modules the notebook could have rewritten.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import io
import json
import os
import sys
import traceback

PASSED, FAILED, NOT_ATTEMPTED, NOT_RUN, FLAGGED = ("passed", "failed", "not attempted",
                                                    "not run", "flagged")
SUBMISSION = "<submission cell "  # the file name the re-executed definitions are compiled under


# --- Fresh check modules --------------------------------------------------------------------

def _exec_file(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Modules of checks/ that lab checks import (``from inferlab.course.checks.oracle import ...``):
# run anew too, so that a check's oracle is as fresh as the check.
HELPERS = ("oracle",)


def load_checks(checks_dir: str, module: str):
    """``(base, lab)``: ``checks/__init__.py`` and ``checks/<module>.py`` executed anew.

    While the lab's file runs, the fresh base stands in for ``inferlab.course.checks`` so that its
    ``from inferlab.course.checks import run_check`` gets the fresh one, and each of ``HELPERS``,
    executed anew, for ``inferlab.course.checks.<helper>``; the notebook's own modules are put
    back afterwards.
    """
    base = _exec_file("inferlab_grading_checks", os.path.join(checks_dir, "__init__.py"))
    key = "inferlab.course.checks"
    names = (key, *(f"{key}.{h}" for h in HELPERS))
    saved = {name: sys.modules.get(name) for name in names}
    sys.modules[key] = base
    try:
        for helper in HELPERS:
            sys.modules[f"{key}.{helper}"] = _exec_file(f"inferlab_grading_{helper}",
                                                        os.path.join(checks_dir, f"{helper}.py"))
        lab = _exec_file(f"inferlab_grading_{module}", os.path.join(checks_dir, f"{module}.py"))
    finally:
        for name, module_before in saved.items():
            if module_before is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module_before
    return base, lab


# --- Did the notebook replace parts of inferlab? ----------------------------------------------

def _defined_names(path: str) -> tuple[set[str], set[str]]:
    """Top-level function and class names a module's source defines."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    return functions, classes


def _code_files(obj) -> set[str]:
    """The files of the code an attribute of a class runs (empty for plain data)."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        return set().union(*(_code_files(f) for f in (obj.fget, obj.fset, obj.fdel) if f))
    while hasattr(obj, "__wrapped__"):  # functools.wraps, lru_cache
        obj = obj.__wrapped__
    code = getattr(obj, "__code__", None)
    return {code.co_filename} if code is not None else set()


def tampered(package_dir: str) -> list[tuple[str, str]]:
    """``[(module.name, what happened)]`` for every loaded ``inferlab`` module whose functions or
    classes (or a class's methods) are no longer the ones its file defines."""
    package_dir = os.path.realpath(package_dir)
    found = []
    for modname, module in sorted(list(sys.modules.items()), key=lambda kv: kv[0]):
        if not (modname == "inferlab" or modname.startswith("inferlab.")):
            continue
        path = getattr(module, "__file__", None)
        if not path or not os.path.realpath(path).startswith(package_dir + os.sep):
            continue
        path = os.path.realpath(path)
        try:
            functions, classes = _defined_names(path)
        except (OSError, SyntaxError):
            continue
        for name in sorted(functions | classes):
            value = module.__dict__.get(name)
            where = f"{modname}.{name}"
            if value is None:
                found.append((where, "was deleted"))
            elif name in functions:
                files = _code_files(value)
                if not files or {os.path.realpath(f) for f in files} != {path}:
                    found.append((where, f"was replaced by {_describe(value)}"))
            elif not isinstance(value, type) or value.__module__ != modname \
                    or value.__qualname__ != name:
                found.append((where, f"was replaced by {_describe(value)}"))
            else:  # a method set from the notebook (the standard library adds some of its own)
                for attr, member in vars(value).items():
                    if any(_is_learner_file(f) for f in _code_files(member)):
                        found.append((f"{where}.{attr}", f"was replaced by {_describe(member)}"))
    return found


def _describe(value) -> str:
    code = getattr(getattr(value, "__func__", value), "__code__", None)
    name = getattr(value, "__qualname__", None) or type(value).__name__
    if code is not None and _is_learner_code(code):
        return f"the notebook's {name}"
    return f"{name} ({type(value).__name__})"


# --- The learner's definitions, executed again -----------------------------------------------

def _is_learner_file(name: str) -> bool:
    """A file name of code compiled from the notebook: its cells, or our re-execution of them."""
    return name.startswith(SUBMISSION) or "ipykernel_" in name or name.startswith("<ipython-input")


def _is_learner_code(code) -> bool:
    return _is_learner_file(code.co_filename)


def _python(source: str) -> str:
    """A cell's source as Python (IPython's magics and shell escapes turned into calls)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(source)
    except Exception:  # no IPython, or a cell it cannot transform: parse the text as it is
        return source


def _binds(node, names: set[str]) -> set[str]:
    """The exercise names a top-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name} & names
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name.split(".")[0]) for a in node.names} & names
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        bound = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        return bound & names
    return set()


def _is_check_call(node, alias: str | None) -> bool:
    """``x = check.x(x)``: a check cell's rebinding, not a definition."""
    value = getattr(node, "value", None)
    return (alias is not None and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and ast.unparse(value.func.value) == alias)


def redefine(user_ns: dict, cells: list[tuple[int, str]], names: set[str], alias: str | None):
    """A copy of the notebook's namespace in which every definition of an exercise name is
    executed again from the submission's source, in cell order.

    Returns ``(ns, where, broken)``: ``where[name]`` is the index of the last cell that defines
    the name; ``broken[name]`` says why a defining cell could not be executed again (then the
    name is absent from ``ns``).
    """
    ns = dict(user_ns)
    where: dict[str, int] = {}
    broken: dict[str, str] = {}
    for index, source in cells:
        text = _python(source)
        try:
            tree = ast.parse(text)
        except SyntaxError as error:
            hit = {n for n in names if _mentions_definition(source, n)}
            for name in hit:
                where[name] = index
                broken[name] = f"SyntaxError: {error.msg} (line {error.lineno})"
                ns.pop(name, None)
            continue
        keep, hit = [], set()
        for node in tree.body:
            bound = _binds(node, names)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                 ast.Import, ast.ImportFrom)) or (bound and not _is_check_call(node, alias)):
                keep.append(node)
                hit |= bound if not _is_check_call(node, alias) else set()
        if not hit:
            continue
        module = ast.Module(body=keep, type_ignores=[])
        try:
            exec(compile(module, f"{SUBMISSION}{index + 1}>", "exec"), ns)
        except Exception as error:
            for name in hit:
                broken[name] = f"{type(error).__name__}: {error}"
                ns.pop(name, None)
        else:
            for name in hit:
                broken.pop(name, None)
        for name in hit:
            where[name] = index
    return ns, where, broken


def _mentions_definition(source: str, name: str) -> bool:
    import re
    return re.search(rf"^\s*(?:def|class)\s+{re.escape(name)}\b|^\s*{re.escape(name)}\s*=",
                     source, re.M) is not None


# --- Is the learner's function the reference? -------------------------------------------------

def _unwrapped(obj):
    seen = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        yield obj
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif hasattr(obj, "__func__"):  # a bound method
            obj = obj.__func__
        else:
            obj = getattr(obj, "__wrapped__", None)


def codes_of(obj) -> set:
    """The code objects that run when ``obj`` (a function, or a class and its methods) runs."""
    out = set()
    for o in _unwrapped(obj):
        if isinstance(o, type):
            for member in vars(o).values():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                parts = (member.fget, member.fset, member.fdel) if isinstance(member, property) \
                    else (member,)
                out |= {p.__code__ for p in parts if hasattr(p, "__code__")}
        elif hasattr(o, "__code__"):
            out.add(o.__code__)
    return out


def _same_as(reference) -> tuple:
    return tuple(getattr(reference, "same_as", ()))


def is_reference(fn, reference) -> str | None:
    """How ``fn`` is the reference, wraps it or subclasses it; None when it is none of these."""
    targets = (reference, *_same_as(reference))
    ref_codes = set().union(*(codes_of(t) for t in targets))
    for o in _unwrapped(fn):
        if any(o is t for t in targets):
            return "is inferlab's reference implementation" if o is fn else \
                "wraps inferlab's reference implementation"
        if getattr(o, "__code__", None) in ref_codes:
            return "runs the code of inferlab's reference implementation"
    if isinstance(fn, type) and any(isinstance(t, type) and issubclass(fn, t) for t in targets):
        return "subclasses inferlab's reference implementation"
    return None


@contextlib.contextmanager
def watch_calls(reference):
    """Record entries into the reference's code whose caller is the submission's code."""
    codes = set().union(*(codes_of(t) for t in (reference, *_same_as(reference))))
    hits: list[str] = []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            caller = frame.f_back
            if caller is not None and _is_learner_code(caller.f_code):
                hits.append(f"line {caller.f_lineno}, in {caller.f_code.co_name}")
        return None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield hits
    finally:
        sys.settrace(previous)


def _name_of(obj) -> str:
    module = getattr(obj, "__module__", "") or ""
    return f"{module}.{getattr(obj, '__qualname__', repr(obj))}".lstrip(".")


# --- The verdicts -------------------------------------------------------------------------------

def _same(a, b) -> bool:
    """``a is b``, or two functions made from one definition (a check may create its reference
    afresh on every call, as a lambda or a local function)."""
    code = getattr(b, "__code__", None)
    return a is b or (code is not None and getattr(a, "__code__", None) is code)


def _not_attempted(*args, **kwargs):
    raise NotImplementedError("the grader asks the check which reference it lends")


def grade_namespace(user_ns: dict, checks_dir: str, module: str, exercises: list[dict],
                    cells: list[tuple[int, str]], alias: str | None = None) -> dict:
    """Run every exercise's fresh check on the learner's function; return exercises and flags."""
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(checks_dir)))
    changed = tampered(package_dir)
    base, lab = load_checks(checks_dir, module)
    names = {e["name"] for e in exercises}
    ns, where, broken = redefine(user_ns, cells, names, alias)
    flags = [{"cell": None, "kind": "rebinds checks" if what.startswith("inferlab.course.checks")
              else "patches inferlab", "message": f"at run time, {what} {how}"}
             for what, how in changed]
    untrusted = [what for what, _ in changed if not what.startswith("inferlab.course.checks")]
    out = []
    for ex in exercises:
        label, name, check = ex["label"], ex["name"], getattr(lab, ex["check"])
        cell = where.get(name)
        entry = {"exercise": label, "result": NOT_RUN, "message": "", "cell": cell}
        out.append(entry)
        with contextlib.redirect_stdout(io.StringIO()), base.strict():
            reference = check(_not_attempted)
        if name in broken:
            entry["message"] = f"its definition in cell {cell + 1} raised {broken[name]}"
            continue
        if name not in ns or name not in where:
            entry["message"] = f"no cell of the notebook defines {name}"
            continue
        fn = ns[name]
        how = is_reference(fn, reference)
        if how:  # one finding: the exercise's row (no separate flag for the same offence)
            entry.update(result=FLAGGED, message=f"{name} {how} ({_name_of(reference)}), "
                                                 "so the check would test inferlab, not the "
                                                 f"learner (cell {cell + 1})")
            ns[name] = reference
            continue
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), base.strict(), \
                    watch_calls(reference) as hits:
                got = check(fn)
        except base.CheckFailed as failure:
            entry.update(result=FAILED, message=str(failure))
            hits = hits if "hits" in locals() else []
        except BaseException as error:  # SystemExit or worse from the learner's code
            if isinstance(error, KeyboardInterrupt):
                raise
            entry.update(result=FAILED, message=f"the check stopped on {type(error).__name__}: "
                                                f"{error}")
        else:
            if got is fn:
                entry.update(result=PASSED, message=printed.getvalue().strip())
            elif _same(got, reference):
                entry.update(result=NOT_ATTEMPTED, message=printed.getvalue().strip())
                ns[name] = reference  # as the notebook's check cell does, so later ones run
            else:
                entry.update(result=FAILED, message="the check returned neither the learner's "
                                                    "function nor the reference")
        if hits:
            entry.update(result=FLAGGED, message=f"{name} calls inferlab's reference "
                                                 f"implementation, {_name_of(reference)} "
                                                 f"(cell {cell + 1}, {hits[0]})")
        if untrusted and entry["result"] == PASSED:
            entry.update(result=FLAGGED, message="passed, but not trusted: the notebook replaced "
                                                 f"{', '.join(untrusted[:3])}, which checks may use")
    return {"exercises": out, "flags": flags}


def run(user_ns: dict, params: dict) -> None:
    """The grading cell's entry point: grade, then write the results with the nonce."""
    result = {"nonce": params["nonce"], "exercises": [], "flags": [], "error": None}
    try:
        result.update(grade_namespace(user_ns, params["checks_dir"], params["module"],
                                      params["exercises"], [tuple(c) for c in params["cells"]],
                                      params.get("alias")))
    except Exception as error:
        result["error"] = "".join(traceback.format_exception_only(type(error), error)).strip()
    with open(params["result_path"], "w", encoding="utf-8") as f:
        json.dump(result, f)
