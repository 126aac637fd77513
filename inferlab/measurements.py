"""Results measured on real devices (``data/measurements/*.json``) and the tables that show them.

The benchmarks (``python -m inferlab.benchmarks.<name>``) write one JSON object a run: what was
measured and, beside it, where and with what (``DeviceInfo.provenance()``: device, torch, CUDA,
threads, date; and the driver, the git commit and the command where the benchmark records them).
The status page of the book reads them here, so a site built on a CPU still shows GPU numbers
with their provenance. A file that cannot be read gets a row saying why.
"""

from __future__ import annotations

import html
import json
import subprocess
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
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def html_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """A plain HTML table of ``rows`` (dicts), numbers to four significant digits."""
    if not rows:
        return ""
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in columns)
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


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
