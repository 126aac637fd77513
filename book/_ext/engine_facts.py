"""Show the engine version beside every claim about what a serving engine does.

Engines change within a release or two, so a sentence such as "vLLM splits a request with n > 1
into n requests" is only true of the version it was read from. Each such claim in the book is
followed by ``{engine}`key```, where ``key`` is a row of ``data/engine_facts.csv``; the role
renders as the engine and version, linked to the page or file the claim was read from, with the
date it was read in the link's title, e.g. "(vLLM 0.12.0)". An unknown key stops the build.
"""

import csv
from pathlib import Path

from docutils import nodes

TABLE = Path(__file__).resolve().parents[2] / "data" / "engine_facts.csv"


def load_facts(path: Path = TABLE) -> dict[str, dict]:
    """The table's rows by key."""
    with open(path, newline="", encoding="utf-8") as f:
        return {row["key"]: row for row in csv.DictReader(f)}


def engine_role(name, rawtext, text, lineno, inliner, options=None, content=None):
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
