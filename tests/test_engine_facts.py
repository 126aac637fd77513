"""Every statement the book makes about what a serving engine does carries the version it was
read from: a row of data/engine_facts.csv, shown beside the claim by the ``{engine}`` role
(book/_ext/engine_facts.py).

Here: every row is complete (engine, version, the claim, a URL and the place in it, an ISO date
it was read on, the chapter page that states it), and every ``{engine}`` role in the book names
a row.
"""

import datetime as dt
import re
import sys

ENGINES = {"vLLM", "SGLang", "TensorRT-LLM", "Dynamo", "llm-d", "LMCache", "FlashInfer",
           "KServe", "Gateway API Inference Extension", "nano-vllm", "transformers", "xgrammar",
           "NIXL", "Mooncake", "DeepEP", "TGI", "llama.cpp", "Ollama", "FlashAttention",
           "FlashMLA", "DeepGEMM", "NCCL", "OpenAI API", "torchao", "gpt-fast"}
ROLE = re.compile(r"\{engine\}`([^`]+)`")


def _facts(root):
    sys.path.insert(0, str(root / "book" / "_ext"))
    try:
        from engine_facts import load_facts
    finally:
        sys.path.pop(0)
    return load_facts(root / "data" / "engine_facts.csv")


def test_every_engine_fact_is_complete(root):
    for key, row in _facts(root).items():
        assert re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", key), key
        assert row["engine"] in ENGINES, f"{key}: unknown engine {row['engine']!r}"
        assert row["version"].strip(), f"{key}: no version"
        assert row["claim"].strip() and row["where"].strip(), f"{key}: no claim or place"
        assert row["source"].startswith("https://"), f"{key}: the source is a URL"
        read = dt.date.fromisoformat(row["read_on"])
        assert read <= dt.date.today(), f"{key}: read in the future"
        assert (root / "book" / f"{row['chapter']}.md").is_file(), f"{key}: no {row['chapter']}"


def test_every_engine_role_names_a_row(root):
    facts = _facts(root)
    for page in sorted((root / "book").glob("*.md")):
        for key in ROLE.findall(page.read_text(encoding="utf-8")):
            assert key in facts, f"{page.name}: {{engine}}`{key}` has no row"
