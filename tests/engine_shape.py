"""How big the engine's per-step path is, and how many modules one HTTP request walks through.

    PYTHONPATH=. python tests/engine_shape.py hotpath   # the functions a step runs, their lines
    PYTHONPATH=. python tests/engine_shape.py walk      # the modules one POST /v1/completions runs
    PYTHONPATH=. python tests/engine_shape.py imports   # circles and arrows between the packages

The first two trace the code as it runs (``sys.setprofile``), so they count what executes, not
what an import graph suggests. ``imports`` reads every ``import`` of the package's modules (those
inside functions and under ``TYPE_CHECKING`` too) and prints the circles among modules and the
arrows between packages that the engine's floors forbid: ``serving/`` or ``model/`` importing
``analysis/`` or ``sim/``, and ``analysis/`` and ``sim/`` importing each other.

``hotpath`` serves a small mixed trace on the tiny model twice, once with whole-prompt prefills
(continuous batching) and once with chunked prefill under a token budget, and records every
Python function of ``inferlab`` (the model's modules, ``inferlab/model/``, excepted: "plus the
model"; but ``inferlab/model/sampling.py`` counts, since the engine's sampler lives there, shared
with the labs' generation loops) that runs inside a step of the loop, i.e. between entering and leaving the loop's
``step`` method. The per-step path is the functions that run in at least ``SHARE`` (3/4) of
a run's steps, in either run: what every step of a busy engine runs (the first steps prefill
without decoding, the last ones only decode; an admission or a retirement runs in fewer).
A comprehension, a lambda or a nested function counts with the function around it. It prints
each function with its lines, and the total. A line counts when it
holds a code token (``tokenize``: not blank, not only a comment), docstrings included; the
count without docstrings is printed too.

``walk`` starts the course server (``inferlab.serve``) on a free local port with the course
model, sends one ``POST /v1/completions`` (warmed up once first), and records every module of
``inferlab`` whose code runs on the server's threads (the HTTP handler's, the engine's: the
model included) from the moment the request is sent until its answer is back.
"""

from __future__ import annotations

import io
import sys
import threading
import tokenize
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARE = 0.75  # a function is on the per-step path if it runs in at least this share of steps
PACKAGE = ROOT / "inferlab"


_RESOLVED: dict[str, Path] = {}


def _inside(path: str, folder: Path) -> bool:
    where = _RESOLVED.get(path)
    if where is None:
        where = _RESOLVED[path] = Path(path).resolve()
    return where.is_relative_to(folder)


def code_lines(code) -> tuple[int, int]:
    """Lines of ``code``'s function that hold a code token: (with docstrings, without)."""
    import inspect

    lines, start = inspect.getsourcelines(code)
    source = "".join(lines)
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    with_doc, without = set(), set()
    doc = _docstring_lines(source)
    for tok in tokens:
        if tok.type in skip:
            continue
        rows = range(tok.start[0], tok.end[0] + 1)
        with_doc.update(rows)
        if not (tok.type == tokenize.STRING and tok.start[0] in doc):
            without.update(rows)
    return len(with_doc), len(without)


def _docstring_lines(source: str) -> set[int]:
    """First lines of the docstrings in ``source`` (the function's and any nested one's)."""
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(source))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(first.lineno)
    return out


def _outermost(codes) -> list:
    """The functions among ``codes`` whose source no other one of them contains (a
    comprehension, a lambda or a nested function is counted with the function around it)."""
    import inspect

    spans = {}
    for code in codes:
        lines, start = inspect.getsourcelines(code)
        spans[code] = (code.co_filename, start, start + len(lines) - 1)
    out = []
    for code, (f, a, b) in spans.items():
        inner = any(g == f and c <= a and b <= d and (c, d) != (a, b)
                    for other, (g, c, d) in spans.items() if other is not code)
        same = sorted((o for o, s in spans.items() if s == (f, a, b)),
                      key=lambda o: o.co_name.startswith("<"))
        if not inner and same[0] is code:
            out.append(code)
    return out


def _trace_steps(run) -> dict:
    """Run ``run()`` and return {code: steps it ran in} for inferlab's functions (the model's
    excepted) called inside the loop's ``step``."""
    model_dir = PACKAGE / "model"
    sampler = model_dir / "sampling.py"  # the engine's sampler: counted, though under model/
    serving = PACKAGE / "serving"
    seen: dict = defaultdict(int)
    depth = [0]
    current: set = set()

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        code = frame.f_code
        is_step = code.co_name == "step" and _inside(code.co_filename, serving)
        if event == "call":
            if is_step:
                depth[0] += 1
                if depth[0] == 1:
                    current.clear()
            if depth[0] and _inside(code.co_filename, PACKAGE) \
                    and (not _inside(code.co_filename, model_dir)
                         or _RESOLVED[code.co_filename] == sampler):
                current.add(code)
        elif is_step:
            depth[0] -= 1
            if depth[0] == 0:
                for c in current:
                    seen[c] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def hotpath() -> int:
    import torch

    from inferlab.model.config import ModelConfig
    from inferlab.model.llama import build_model
    from inferlab.serving.config import ServingConfig
    from inferlab.serving.engine import serve
    from inferlab.serving.request import Request

    torch.manual_seed(0)
    model = build_model(ModelConfig.from_name("tiny").scaled(n_layers=2, max_seq_len=256))
    gen = torch.Generator().manual_seed(0)
    requests = []
    for i in range(12):
        n = int(torch.randint(4, 60, (1,), generator=gen))
        prompt = tuple(torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist())
        requests.append(Request(prompt, 6 + i % 5, arrival_s=0.0,
                                temperature=0.8 if i % 3 == 0 else 0.0, seed=i))
    hot: set = set()
    for config in (ServingConfig(num_blocks=64, max_batch=8),
                   ServingConfig(num_blocks=64, max_batch=8, token_budget=32)):
        seen = _trace_steps(lambda: serve(model, requests, config))
        steps = max(seen.values())  # the loop's own ``step`` runs in every one
        hot |= {code for code, n in seen.items() if n >= SHARE * steps}
    seen = hot
    rows = []
    for code in _outermost(seen):
        with_doc, without = code_lines(code)
        path = Path(code.co_filename).resolve().relative_to(ROOT)
        rows.append((str(path), code.co_qualname, with_doc, without))
    rows.sort()
    for path, name, a, b in rows:
        print(f"{a:4d} {b:4d}  {path}:{name}")
    files = {r[0] for r in rows}
    print(f"{sum(r[2] for r in rows)} lines ({sum(r[3] for r in rows)} without docstrings) in "
          f"{len(rows)} functions in {len(files)} files (the model's modules not counted, its "
          f"sampler counted)")
    return 0


def walk() -> int:
    import json
    import urllib.request

    from inferlab.model.config import ModelConfig  # noqa: F401
    from tests.course_server import start  # the course model behind the app, as tests run it

    modules: set = set()
    recording = threading.Event()

    def profile(frame, event, arg):
        if event == "call" and recording.is_set():
            path = frame.f_code.co_filename
            if _inside(path, PACKAGE):
                modules.add(str(_RESOLVED[path].relative_to(ROOT)))

    # every thread started from here on: the server's and the engine's (the client is this one)
    threading.setprofile(profile)
    server, engine = start()

    body = json.dumps({"model": "course-target", "prompt": "Once upon a time",
                       "max_tokens": 4, "temperature": 0}).encode()
    with server:
        def post():
            req = urllib.request.Request(server.url + "/v1/completions", body,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())

        post()  # warm-up: imports and first-call set-up are not the walk
        recording.set()
        answer = post()
        recording.clear()
        threading.setprofile(None)
    for m in sorted(modules):
        print(m)
    print(f"{len(modules)} modules ran for one POST /v1/completions "
          f"({answer['usage']['completion_tokens']} tokens)")
    return 0


def imports() -> int:
    import ast

    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            edges[name] |= {t for t in targets if t in modules and t != name}
    circles, index, low, stack, on, counter = [], {}, {}, [], set(), [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v), on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            visit(v)

    def package(m):
        parts = m.split(".")
        return parts[1] if len(parts) > 2 else m

    arrows = {(package(a), package(b)) for a in edges for b in edges[a]}
    forbidden = {(a, b) for a, b in arrows if (a in ("serving", "model") and b in
                                                ("analysis", "sim"))}
    if ("analysis", "sim") in arrows and ("sim", "analysis") in arrows:
        forbidden |= {("analysis", "sim"), ("sim", "analysis")}
    for c in circles:
        print("circle:", " -> ".join(c))
    for a, b in sorted(forbidden):
        who = sorted(f"{x} -> {y}" for x in edges for y in edges[x]
                     if package(x) == a and package(y) == b)
        print(f"forbidden arrow {a}/ -> {b}/: " + "; ".join(who))
    print(f"{len(circles)} circles, {len(forbidden)} forbidden arrows between packages")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    what = sys.argv[1] if len(sys.argv) > 1 else "hotpath"
    sys.exit({"hotpath": hotpath, "walk": walk, "imports": imports}[what]())
