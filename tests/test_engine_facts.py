"""Every statement the book makes about what a serving engine does carries the version it was
read from: a row of data/engine_facts.csv, shown beside the claim by the ``{engine}`` role
(book/_ext/engine_facts.py).

Here: every row is complete (engine, version, the claim, a URL and the place in it, an ISO date
it was read on, the chapter page that states it) and is cited on that page; every ``{engine}``
role in the book names a row; and the chapters hold every engine statement to a row. The rule,
``unmarked_claims`` in the extension: a prose paragraph that names an engine of ``ENGINES``
carries an ``{engine}`` role of that engine (or one whose claim names it). Code, the References
section and a name followed at once by a citation ("vLLM {cite:p}`kwon2023pagedattention`",
which labels a paper) are exempt. The tests below show the rule failing on an unmarked claim.
"""

import datetime as dt
import re
import sys

import pytest

from inferlab.course import catalog

ENGINES = {"vLLM", "SGLang", "TensorRT-LLM", "Dynamo", "llm-d", "LMCache", "FlashInfer",
           "KServe", "Gateway API Inference Extension", "nano-vllm", "transformers", "xgrammar",
           "NIXL", "Mooncake", "DeepEP", "TGI", "llama.cpp", "Ollama", "FlashAttention",
           "FlashMLA", "DeepGEMM", "NCCL", "OpenAI API", "torchao", "gpt-fast"}
ROLE = re.compile(r"\{engine\}`([^`]+)`")

# Chapters whose engine statements are not yet held to the rule: they were being rewritten by
# other hands when the rule arrived. Empty this after merging them; a chapter leaves the set
# when every engine statement on its pages carries a role.
PENDING: set[str] = set()


def _ext():
    sys.path.insert(0, str(catalog.ROOT / "book" / "_ext"))
    try:
        import engine_facts
    finally:
        sys.path.pop(0)
    return engine_facts


def _facts(root):
    return _ext().load_facts(root / "data" / "engine_facts.csv")


def test_every_engine_fact_is_complete(root):
    ext = _ext()
    assert set(ext.ENGINE_NAMES) == ENGINES, "every engine has a name the rule can find"
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


def test_every_row_is_cited_on_the_page_it_names(root):
    """A row no page cites is a fact nobody re-reads for a reason: its page has changed."""
    stale = [f"{key}: not cited on {row['chapter']}" for key, row in _facts(root).items()
             if f"{{engine}}`{key}`" not in (root / "book" / f"{row['chapter']}.md").read_text(
                 encoding="utf-8")]
    assert not stale, "\n".join(stale)


# --- The rule: every engine statement in a checked chapter carries a role ---------------------

def test_pending_names_chapters_that_exist_and_leaves_some_checked(root):
    chapters = set(catalog.chapters(root))
    assert PENDING <= chapters, f"not chapters: {sorted(PENDING - chapters)}"
    assert chapters - PENDING, "no chapter is held to the rule"


@pytest.mark.parametrize("chapter", sorted(set(catalog.chapters()) - PENDING))
def test_every_engine_statement_carries_its_version(root, chapter):
    ext, facts = _ext(), _facts(root)
    found = []
    for page in catalog.chapters(root)[chapter]:
        text = (root / f"{page}.md").read_text(encoding="utf-8")
        found += ext.unmarked_claims(page, text, facts)
    assert not found, (
        "paragraphs that name an engine without an {engine} role for it (add a row to "
        "data/engine_facts.csv and the role after the claim):\n"
        + "\n".join(f"  {u.page}.md:{u.line} {u.engine}: {u.text[:150]}" for u in found))


FACTS = {
    "vllm-n": {"engine": "vLLM", "claim": "splits a request with n > 1 into n requests"},
    "sglang-page": {"engine": "SGLang", "claim": "pages hold one token by default"},
    "vllm-grammar": {"engine": "vLLM", "claim": "enforces grammars with the XGrammar backend"},
}
PAGE = """---
jupytext: {{}}
---

# A page

{claim}

```{{code-cell}} ipython3
print("vLLM in code is not prose")
```

- vLLM {{cite:p}}`kwon2023pagedattention` introduced paging (a paper's label);
- an OpenAI-compatible server names a shape of API, not what a vendor does.

```{{admonition}} Takeaway
:class: tip
{takeaway}
```

## References

vLLM and SGLang are described in their papers {{cite:p}}`kwon2023pagedattention`.
"""


def _unmarked(claim, takeaway="Nothing here names an engine."):
    return [(u.engine, u.line) for u in
            _ext().unmarked_claims("page", PAGE.format(claim=claim, takeaway=takeaway), FACTS)]


def test_the_rule_fails_on_an_unmarked_claim():
    assert _unmarked("vLLM splits a request with n > 1 into n requests.") == [("vLLM", 7)]
    # a role of another engine does not cover it, nor does a key the table lacks
    assert _unmarked("vLLM splits n > 1 into n requests {engine}`sglang-page`.") == [("vLLM", 7)]
    assert _unmarked("vLLM splits n > 1 into n requests {engine}`vllm-gone`.") == [("vLLM", 7)]
    # a takeaway box is prose too, and a role in one list item covers only that item
    assert _unmarked("Fine.", takeaway="SGLang pages hold one token.") == [("SGLang", 18)]
    assert _unmarked("- vLLM splits n {engine}`vllm-n`;\n- SGLang pages hold one token.") \
        == [("SGLang", 8)]
    # a library named the way the book names it is found too, and an API by its name
    assert _unmarked("Hugging Face's `generate` drafts by lookup.") == [("transformers", 7)]
    assert _unmarked("The Responses API keeps state by id.") == [("OpenAI API", 7)]


def test_the_rule_accepts_marked_claims_and_its_exemptions():
    assert _unmarked("vLLM splits a request with n > 1 into n requests {engine}`vllm-n`.") == []
    # the role may sit anywhere in the paragraph, and a row whose claim names an engine covers it
    assert _unmarked("vLLM splits n > 1 {engine}`vllm-n`;\nthe rest is the same.") == []
    assert _unmarked("vLLM runs XGrammar {engine}`vllm-grammar`.") == []
    # code, a paper's label, "OpenAI-compatible" and the References section: the page above;
    # a vendor's models or prices are not its API
    assert _unmarked("Nothing here names an engine.") == []
    assert _unmarked("OpenAI's gpt-oss models ship MXFP4 weights; the OpenAI row is dated.") == []


def test_the_rule_catches_a_role_removed_from_chapter_6(root):
    """On a real page: drop one role and its paragraph is reported."""
    ext, facts = _ext(), _facts(root)
    text = (root / "book" / "ch06_2_drafters.md").read_text(encoding="utf-8")
    assert ext.unmarked_claims("ch06_2_drafters", text, facts) == []
    cut = re.sub(r"\s*\{engine\}`vllm-spec-suffix`", "", text)
    assert cut != text
    [found] = ext.unmarked_claims("ch06_2_drafters", cut, facts)
    assert found.engine == "vLLM" and "method `suffix`" in found.text


# --- The status page lists the facts by age ----------------------------------------------------

def test_facts_are_listed_oldest_read_first(root):
    rows = {k: {"key": k, "engine": e, "read_on": d} for k, e, d in (
        ("b", "vLLM", "2026-12-02"), ("a", "SGLang", "2026-12-02"), ("c", "vLLM", "2025-01-31"))}
    assert [r["key"] for r in _ext().facts_by_age(rows)] == ["c", "a", "b"]
    status = (root / "book" / "status.md").read_text(encoding="utf-8")
    assert "facts_by_age(" in status, "the status page lists the engine facts by age"
