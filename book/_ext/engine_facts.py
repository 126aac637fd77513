"""Show the engine version beside every claim about what a serving engine does.

Engines change within a release or two, so a sentence such as "vLLM splits a request with n > 1
into n requests" is only true of the version it was read from. Each such claim in the book is
followed by ``{engine}`key```, where ``key`` is a row of ``data/engine_facts.csv``; the role
renders as the engine and version, linked to the page or file the claim was read from, with the
date it was read in the link's title, e.g. "(vLLM 0.12.0)". An unknown key stops the build.

Two helpers read the table for the rest of the book: ``facts_by_age`` orders the rows oldest
read first (the status page lists them so, and a maintainer re-reads from the top), and
``unmarked_claims`` finds the paragraphs of a page that name an engine without a role for it
(``tests/test_engine_facts.py`` holds the chapters to it). Both are plain Python, so the test
and the status page's code cell import this file without Sphinx.
"""

import csv
import re
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).resolve().parents[2] / "data" / "engine_facts.csv"


def load_facts(path: Path = TABLE) -> dict[str, dict]:
    """The table's rows by key."""
    with open(path, newline="", encoding="utf-8") as f:
        return {row["key"]: row for row in csv.DictReader(f)}


def facts_by_age(facts: dict[str, dict]) -> list[dict]:
    """The rows, oldest read first; rows read on the same day by engine, then key."""
    return sorted(facts.values(), key=lambda r: (r["read_on"], r["engine"].lower(), r["key"]))


# --- Which paragraphs name an engine without saying which version ------------------------------

# How prose names each engine the book makes claims about. Case matters: "vLLM" is the engine,
# "vllm" in `vllm serve` is a command. A library whose name is also an English word is matched
# only in the forms the book uses for the library (`transformers`, "Hugging Face's ...").
ENGINE_NAMES = {
    "vLLM": r"vLLM",
    "SGLang": r"SGLang",
    "TensorRT-LLM": r"TensorRT-LLM|TRT-LLM",
    "Dynamo": r"Dynamo",
    "llm-d": r"llm-d",
    "LMCache": r"LMCache",
    "FlashInfer": r"FlashInfer",
    "KServe": r"KServe",
    "Gateway API Inference Extension": r"Gateway API Inference Extension|GAIE",
    "nano-vllm": r"nano-vllm",
    "transformers": r"`transformers`|Hugging Face(?:'s| transformers)",
    "xgrammar": r"XGrammar|xgrammar",
    "NIXL": r"NIXL",
    "Mooncake": r"Mooncake",
    "DeepEP": r"DeepEP",
    "TGI": r"TGI",
    "llama.cpp": r"llama\.cpp",
    "Ollama": r"Ollama",
    "FlashAttention": r"FlashAttention(?:-\d)?",
    "FlashMLA": r"FlashMLA",
    "DeepGEMM": r"DeepGEMM",
    "NCCL": r"NCCL",
    "torchao": r"torchao",
    "gpt-fast": r"gpt-fast",
    # the API OpenAI defines, named as an API ("OpenAI's Completions API", "the Responses API");
    # "an OpenAI-compatible server" names a shape, and OpenAI's models and prices are not its API
    "OpenAI API": r"OpenAI(?:'s)? (?:[A-Z]\w* )*API|(?<!compatible )(?:Chat )?Completions API"
                  r"|Responses API",
}
_NAME = {engine: re.compile(rf"(?<![\w-])(?:{pattern})(?![\w-])")
         for engine, pattern in ENGINE_NAMES.items()}
# The one exemption: a name followed at once by a citation labels that paper's system
# ("vLLM {cite:p}`kwon2023pagedattention`"), and the citation is the source of what follows.
PAPER_LABEL = re.compile(r"(?:'s)?\s*\(?\{cite:[pt]\}")
ROLE = re.compile(r"\{(\w[\w:-]*)\}`([^`]*)`")
LINK = re.compile(r"\]\([^)]*\)")                       # a link's target, not its text
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,}|:{3,})\s*(\{[\w:-]+\})?(.*)$")
# directives whose body is prose the reader sees; every other fence is code or data
PROSE_DIRECTIVES = {"{admonition}", "{exercise}", "{solution}", "{solution-start}", "{note}",
                    "{tip}", "{warning}", "{important}", "{caution}", "{seealso}", "{figure}",
                    "{margin}", "{sidebar}", "{epigraph}", "{dropdown}", "{hint}"}


@dataclass
class Unmarked:
    page: str
    line: int          # where the paragraph starts, 1-based
    engine: str
    text: str          # the paragraph, whitespace collapsed


def prose_paragraphs(text: str):
    """``(first line, paragraph)`` for every paragraph a reader sees as prose: not the front
    matter, code cells, code blocks or directive options, not headings or labels, and not the
    References section (a list of sources, not claims). A list item is a paragraph of its own."""
    lines = text.split("\n")
    i = 0
    if lines and lines[0].strip() == "---":                 # front matter
        i = next(j for j in range(1, len(lines)) if lines[j].strip() == "---") + 1
    fences: list[str] = []      # open fences, innermost last: their closing marker
    code_until: str | None = None
    references = False
    para, start = [], 0

    def flush():
        nonlocal para
        if para:
            yield start, " ".join(" ".join(para).split())
        para = []

    while i < len(lines):
        line = lines[i]
        n = i + 1
        i += 1
        stripped = line.strip()
        if code_until is not None:                          # inside code: skip to its end
            if stripped == code_until:
                code_until = None
            continue
        m = FENCE.match(line)
        if m:
            marker, directive = m.group(2), m.group(3)
            if fences and stripped == fences[-1]:           # a prose directive closes
                yield from flush()
                fences.pop()
                continue
            yield from flush()
            if directive in PROSE_DIRECTIVES:
                fences.append(marker)
                while i < len(lines) and lines[i].strip().startswith(":") \
                        and not lines[i].strip().startswith(":::"):
                    i += 1                                  # :label:, :class: options
            else:
                code_until = marker
            continue
        if stripped.startswith("#") and re.match(r"#+ ", stripped):
            yield from flush()
            references = stripped.startswith("## ") and stripped[3:].strip() == "References"
            continue
        if references:
            continue
        if not stripped or re.fullmatch(r"\(.+\)=", stripped) or stripped.startswith("<!--"):
            yield from flush()
            continue
        if re.match(r"([-*+]|\d+\.)\s", stripped):          # a list item starts a paragraph
            yield from flush()
        if not para:
            start = n
        para.append(stripped)
    yield from flush()


def unmarked_claims(page: str, text: str, facts: dict[str, dict]) -> list[Unmarked]:
    """Paragraphs of ``text`` that name an engine with no ``{engine}`` role for it.

    A paragraph that names an engine must carry a role whose row is that engine's, or whose
    claim names it (vLLM's row "compiles constraints with the XGrammar backend" covers the
    XGrammar it names). A name followed at once by a citation (``PAPER_LABEL``) labels a paper
    and needs no role. Role keys the table lacks are test_every_engine_role_names_a_row's to
    report; here they cover nothing."""
    found = []
    for line, para in prose_paragraphs(text):
        rows = [facts[key.strip()] for kind, key in ROLE.findall(para)
                if kind == "engine" and key.strip() in facts]
        # blank out what the reader does not read as prose: role targets and link targets
        seen = ROLE.sub(lambda m: " " * len(m.group()) if m.group(1) != "engine" else
                        m.group(), para)
        seen = LINK.sub(lambda m: " " * len(m.group()), seen)
        for engine, name in _NAME.items():
            covered = any(r["engine"] == engine or name.search(r["claim"]) for r in rows)
            if covered:
                continue
            for m in name.finditer(seen):
                if not PAPER_LABEL.match(para, m.end()):
                    found.append(Unmarked(page, line, engine, para))
                    break
    return found


# --- The role ----------------------------------------------------------------------------------

def engine_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    from docutils import nodes

    facts = inliner.document.settings.env.app.config.engine_facts or load_facts()
    row = facts.get(text.strip())
    if row is None:
        msg = inliner.reporter.error(f"no row {text!r} in data/engine_facts.csv", line=lineno)
        return [inliner.problematic(rawtext, rawtext, msg)], [msg]
    label = f"{row['engine']} {row['version']}"
    link = nodes.reference(rawtext, label, refuri=row["source"],
                           reftitle=f"read {row['read_on']}: {row['where']}")
    span = nodes.inline(rawtext, "", classes=["engine-fact"])
    span += [nodes.Text("("), link, nodes.Text(")")]
    return [span], []


def _load(app, config):
    config.engine_facts = load_facts()


def setup(app):
    app.add_config_value("engine_facts", {}, "env")
    app.connect("config-inited", _load)
    app.add_role("engine", engine_role)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
