"""Results measured on real devices (``data/measurements/*.json``) and the tables that show them.

The benchmarks (``python -m inferlab.benchmarks.<name>``) write one JSON object a run: what was
measured and, beside it, where and with what (``DeviceInfo.provenance()``: device, torch, CUDA,
threads, date; and the driver, the git commit and the command where the benchmark records them).
The status page of the book reads them here, so a site built on a CPU still shows GPU numbers
with their provenance. A file that cannot be read gets a row saying why.

What the page shows of a record (``record_html``): one sentence of provenance, its scalar results
as a table of quantity and value, and its rows of results as a table whose nested values are
flattened into columns (``ttft.engine_s``), turned on its side when it has more columns than
rows and more than fit the column. Notes a record keeps for its maintainers (``note``,
``*_note``, ``*_source``) stay in the file. ``BENCHMARKS`` lists what the chapters refer to and
the command that records each on a GPU (``benchmarks_html``). ``facts_html`` shows the rows
of ``data/engine_facts.csv``, what the book says each engine does, with the release read.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from inferlab.data import data_path

# Keys that say where and how a result was measured, in the order the table shows them.
PROVENANCE = ("benchmark", "device_name", "table_row", "dtype", "torch", "cuda", "driver",
              "threads", "date", "git_commit", "command")
_NOT_RESULTS = set(PROVENANCE) | {"device", "model"}


def driver_version() -> str | None:
    """The NVIDIA driver's version from nvidia-smi, or None where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit() -> str | None:
    """The commit of the checkout the package runs from, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def default_path(benchmark: str, info) -> Path:
    """``data/measurements/<benchmark>_<device>_<date>.json`` for a ``DeviceInfo``."""
    slug = "".join(c if c.isalnum() else "-" for c in info.name.lower()).strip("-")
    folder = data_path("hardware.csv").parent / "measurements"
    return folder / f"{benchmark}_{slug}_{info.provenance()['date']}.json"


def write_record(record: dict, info, path: str | Path | None = None) -> Path:
    """Write one run's ``record`` as JSON, with its provenance added (device, torch, CUDA,
    threads, date from ``info``; the driver and the git commit), to ``path`` or the default."""
    full = {**record, **info.provenance(), "driver": driver_version(), "git_commit": git_commit()}
    out = Path(path) if path is not None else default_path(record["benchmark"], info)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")
    return out


def measurements_folder() -> Path | None:
    """``data/measurements`` of the checkout (or of the installed package); None if absent."""
    folder = data_path("hardware.csv").parent / "measurements"
    return folder if folder.is_dir() else None


def load_measurements(folder: str | Path | None = None) -> list[dict]:
    """``[{"file": name, "record": dict or None, "error": str or None}]``, sorted by file name."""
    folder = measurements_folder() if folder is None else Path(folder)
    if folder is None or not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            error = None if isinstance(record, dict) else "not a JSON object"
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            record, error = None, f"unreadable: {exc}"
        out.append({"file": path.name, "record": record if error is None else None, "error": error})
    return out


def provenance_row(entry: dict) -> dict:
    """One row of the provenance table: the file, then each ``PROVENANCE`` key it has."""
    record = entry["record"] or {}
    row = {"file": entry["file"], "model": record.get("model", "")}
    for key in PROVENANCE:
        value = record.get(key, "")
        if key == "git_commit" and value:
            value = str(value)[:10]
        row[key] = "" if value is None else value
    if not row["device_name"]:
        row["device_name"] = record.get("device", "")
    if entry["error"]:
        row["benchmark"] = entry["error"]
    return row


def results_of(record: dict) -> tuple[dict, list[dict]]:
    """A record's results: its scalar values (nested dicts flattened with '.'), and the rows of
    its first list of objects (``"results": [...]``) if it has one."""
    scalars, rows = {}, []

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(value, (int, float, str, bool)) or value is None:
            scalars[prefix] = value

    for key, value in record.items():
        if key in _NOT_RESULTS:
            continue
        if isinstance(value, list):
            if not rows and value and all(isinstance(v, dict) for v in value):
                rows = value
        else:
            walk(key, value)
    return scalars, rows


def _fmt(value) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e15 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return ", ".join(_fmt(v) if not isinstance(v, float) else f"{v:.3g}" for v in value)
    return "" if value is None else str(value)


# A joint inside a name where a line may break: after "_" or "/", a "." before a letter, or a
# "+" between letters ("ttft.engine_s", "solutions/01_roofline.ipynb", "weights+activations";
# never inside a number or a version such as 2.13.0+cpu), so that a narrow cell wraps a long key
# at its joints instead of between two letters.
_JOINT = re.compile(r"((?<=[\w\-])[_/]|(?<=[\w\-])\.(?=[A-Za-z])|(?<=[A-Za-z])\+(?=[A-Za-z]))"
                    r"(?=\w)")


LONG = 20  # a hyphenated name longer than this may break after a hyphen inside it


def breakable(text: str) -> str:
    """``text`` as HTML, with a break opportunity (``<wbr>``) after each joint of a long name,
    and no break at a hyphen between joints (a browser would break ``-m`` and ``2026-12-02``
    after their hyphens) unless the piece is longer than ``LONG`` characters
    (``x-gateway-inference-objective`` may break after ``gateway-``, never after ``--``); a
    piece with no hyphen longer than twice ``LONG`` (a sha256 digest) every 16 characters."""
    def piece(p: str) -> str:
        if "-" not in p:   # a digest or any other run this long may break every 16 characters
            return "<wbr>".join(html.escape(p[i:i + 16]) for i in range(0, len(p), 16)) \
                if len(p) > 2 * LONG else html.escape(p)
        if len(p) > LONG:   # after a hyphen inside it, never within a leading run (--)
            return "<wbr>".join(piece(q) for q in re.split(r"(?<=[^\s-]-)(?=[^-])", p))
        return f'<span style="white-space: nowrap">{html.escape(p)}</span>'

    def word(w: str) -> str:
        parts = _JOINT.split(w)
        pieces = ["".join(parts[i:i + 2]) for i in range(0, len(parts), 2)]  # each ends at a joint
        return "<wbr>".join(piece(p) for p in pieces)

    return "".join(word(w) if w.strip() else w for w in re.split(r"(\s+)", str(text)))


def _numeric(text: str) -> bool:
    return bool(re.fullmatch(r"[-+~<>$]?[\d,]*\.?\d+(e[-+]?\d+)?\s*(%|x|s)?", text.strip()))


def html_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """A plain HTML table of ``rows`` (dicts), numbers to four significant digits and aligned
    right; long names in headers and cells may break at their joints (``breakable``)."""
    if not rows:
        return ""
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))

    def cell(value) -> str:
        text = _fmt(value)
        align = "right" if _numeric(text) else "left"
        return f'<td style="text-align: {align}">{breakable(text)}</td>'

    head = "".join(f"<th>{breakable(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(cell(r.get(c)) for c in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# --- What the status page shows of a record -------------------------------------------------

# Notes a record keeps for whoever reruns it (how a run went, where a number was read): they
# stay in the file, and the page shows results.
_NOTE = re.compile(r"(^|[._])(note|notes|source)$")
WIDE = 6  # a table of rows with more columns than this (and than rows) is shown on its side


def _flat(value, prefix: str = "") -> dict:
    """A result row with nested dicts flattened into dotted keys; notes left out."""
    out = {}
    for key, v in (value.items() if isinstance(value, dict) else []):
        name = f"{prefix}.{key}" if prefix else str(key)
        if _NOTE.search(name):
            continue
        if isinstance(v, dict):
            out.update(_flat(v, name))
        else:
            out[name] = v
    return out


def shown_results(record: dict) -> tuple[dict, list[dict]]:
    """``results_of(record)`` as the page shows it: notes left out, and each row of results
    flattened into one level of columns."""
    scalars, rows = results_of(record)
    scalars = {k: v for k, v in scalars.items() if not _NOTE.search(k)}
    return scalars, [_flat(r) for r in rows]


def rows_html(rows: list[dict]) -> str:
    """Rows of results as a table; on its side (one column a row, headed by the row's first
    text field) when it has more than ``WIDE`` columns and more columns than rows."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    if len(columns) <= WIDE or len(columns) <= len(rows):
        return html_table(rows, columns)
    label = next((c for c in columns if all(isinstance(r.get(c), str) for r in rows)), None)
    heads = [str(r[label]) if label else f"row {i + 1}" for i, r in enumerate(rows)]
    if len(set(heads)) < len(heads):
        heads = [f"{i + 1}: {h}" for i, h in enumerate(heads)]
    turned = [{"quantity": c, **{h: r.get(c) for h, r in zip(heads, rows)}}
              for c in columns if c != label]
    return html_table(turned, ["quantity"] + heads)


def provenance_html(entry: dict) -> str:
    """One sentence: where, with what and how a record was measured."""
    row = provenance_row(entry)
    if entry["error"]:
        return f"<p>{html.escape(entry['error'])}</p>"
    parts = [f"measured on {row['device_name'] or 'an unnamed device'}"]
    if row["threads"]:
        parts[-1] += f" ({row['threads']} torch thread{'s' if row['threads'] != 1 else ''})"
    for key, what in (("dtype", "in"), ("torch", "torch"), ("cuda", "CUDA"),
                      ("driver", "driver"), ("date", "on"), ("git_commit", "at commit")):
        if row.get(key):
            parts.append(f"{what} {row[key]}")
    if row.get("model"):
        parts.insert(0, f"model {row['model']}")
    text = breakable(", ".join(parts))
    if row.get("command"):
        text += f"; command <code>{breakable(row['command'])}</code>"
    return f"<p>{text[0].upper() + text[1:]}.</p>"


def record_html(entry: dict) -> str:
    """A record as the status page shows it: its file, its provenance, its results."""
    parts = [f"<h4>{breakable(entry['file'])}</h4>", provenance_html(entry)]
    if entry["record"]:
        scalars, rows = shown_results(entry["record"])
        if scalars:
            parts.append(html_table([{"quantity": k, "value": v} for k, v in scalars.items()]))
        if rows:
            parts.append(rows_html(rows))
    return "\n".join(parts)


@dataclass(frozen=True)
class Benchmark:
    """A benchmark the chapters refer to: the page that reads it, what it measures, and the
    command that records it on a CUDA GPU (None for one that runs on the CPU only)."""

    name: str
    page: str
    what: str
    gpu_command: str | None


BENCHMARKS = (
    Benchmark("roofline", "Chapter 1", "bandwidth and peak FLOP/s probes, a decode step against "
              "its floor", "python -m inferlab.benchmarks.roofline"),
    Benchmark("kv_cache", "Chapter 2", "cached against recomputed decode as the context grows",
              "python -m inferlab.benchmarks.kv_cache --device cuda --json "
              "data/measurements/kv_cache_cuda.json"),
    Benchmark("decode_gpu", "Chapter 2", "batch-1 decode of a Llama-2-7B-shaped model with CUDA "
              "graphs, and its bandwidth utilisation",
              "python -m inferlab.benchmarks.decode_gpu --model llama-2-7b"),
    Benchmark("paged", "Chapter 3", "the fused Triton paged kernel against contiguous attention",
              "python -m inferlab.benchmarks.paged --device cuda"),
    Benchmark("batching", "Chapter 4", "continuous against static batching, and the simulator's "
              "error", "python -m inferlab.benchmarks.batching --device cuda"),
    Benchmark("quant", "Chapter 5", "int8 weight-only decode against float (bf16 on a GPU), and "
              "the perplexity of each weight format",
              "python -m inferlab.benchmarks.quant --device cuda"),
    Benchmark("speculative", "Chapter 6", "the trained pair's acceptance, tokens per verification "
              "against the formula, and the speed-up against k at batch 1; prompt lookup on code",
              None),
    Benchmark("prefill_decode", "Chapter 7", "chunked prefill's stalls on the engine, and the "
              "simulator's error against it",
              "python -m inferlab.benchmarks.prefill_decode --device cuda"),
    Benchmark("lab_times", "Instructor guide", "how long each solved lab takes to run",
              "python -m inferlab.benchmarks.gpu_suite --out gpu-run"),
)


def benchmarks_html(entries: list[dict], benchmarks=BENCHMARKS) -> str:
    """The benchmarks the chapters refer to, each with the runs recorded and, where no GPU has
    run it, the command a reader with a GPU runs to record one."""
    runs: dict[str, list[dict]] = {}
    for e in entries:
        runs.setdefault((e["record"] or {}).get("benchmark"), []).append(e["record"])
    rows = []
    for b in benchmarks:
        found = runs.get(b.name, [])
        recorded = "; ".join(f"{r.get('device_name') or r.get('device')} ({r.get('date')})"
                             for r in found) or "none yet"
        gpu = [r for r in found if r.get("cuda")]
        if gpu:
            on_gpu = "yes: " + "; ".join(f"{r.get('device_name')} ({r.get('date')})" for r in gpu)
        elif b.gpu_command is None:
            on_gpu = "runs on the CPU only"
        else:
            on_gpu = None
        rows.append((b, recorded, on_gpu))
    body = []
    for b, recorded, on_gpu in rows:
        gpu = (html.escape(on_gpu) if on_gpu else
               f"not yet: on a CUDA GPU, <code>{breakable(b.gpu_command)}</code> records one")
        body.append(f"<tr><td><b>{breakable(b.name)}</b><br>{html.escape(b.page)}</td>"
                    f"<td>{html.escape(b.what)}</td><td>{breakable(recorded)}</td>"
                    f"<td>{gpu}</td></tr>")
    return ("<table><thead><tr><th>benchmark</th><th>what it measures</th>"
            "<th>runs recorded</th><th>on a GPU</th></tr></thead><tbody>" + "".join(body)
            + "</tbody></table>")


# --- The engine facts, oldest read first -----------------------------------------------------

_COMMIT = re.compile(r"((?:commit )?)([0-9a-f]{12})[0-9a-f]{1,28}")


def facts_html(facts: list[dict], pages: dict[str, str], built) -> str:
    """The rows of ``data/engine_facts.csv`` (``facts``, in the order given) as a table: the
    engine and the release read (a commit as its first 12 characters, as git shortens one; the
    link has it whole), the claim, the date read and its age on ``built`` (a ``datetime.date``),
    the page that states it (``pages`` maps a page's stem to how a reader finds it, "ch. 9,
    p. 3") and a link to the source. Long names break only at their joints (``breakable``), so
    the table's columns share the width and it fits the column of the page."""
    import datetime as dt

    body = []
    for f in facts:
        version = _COMMIT.sub(r"\1\2", f["version"])
        age = (built - dt.date.fromisoformat(f["read_on"])).days
        page = f["chapter"]
        where = html.escape(pages.get(page, page)).replace(". ", ".&nbsp;")  # "ch. 10" whole
        body.append(
            f"<tr><td>{breakable(f['engine'])} {breakable(version)}</td>"
            f"<td>{breakable(f['claim'])}</td>"
            f"<td>{breakable(f['read_on'])} ({age}&nbsp;d)</td>"
            f"<td><a href=\"{html.escape(page)}.html\">{where}</a></td>"
            f"<td><a href=\"{html.escape(f['source'])}\" title=\"{html.escape(f['where'])}\">"
            "source</a></td></tr>")
    return ("<table><thead><tr><th>engine, release</th><th>what the book says it does</th>"
            "<th>read on (age)</th><th>page</th><th>read from</th></tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")


def report_html(folder: str | Path | None = None) -> str:
    """The status page's section: a provenance table, then each file's results."""
    entries = load_measurements(folder)
    if not entries:
        where = folder or "data/measurements/"
        return (f"<p>No measurements yet: {html.escape(str(where))} holds no JSON file. A run of "
                "<code>python -m inferlab.benchmarks.decode_gpu</code> on a GPU adds one.</p>")
    rows = [provenance_row(e) for e in entries]
    columns = ["file", "model"] + [k for k in PROVENANCE if any(r[k] for r in rows)]
    parts = [html_table(rows, columns)]
    for entry in entries:
        if entry["record"] is None:
            continue
        scalars, table = results_of(entry["record"])
        parts.append(f"<h4>{html.escape(entry['file'])}</h4>")
        if scalars:
            parts.append(html_table([{"quantity": k, "value": v} for k, v in scalars.items()]))
        if table:
            parts.append(html_table(table))
    return "\n".join(parts)
