"""The status page's measurement tables: empty folder, a record with provenance, a broken file."""

import json
import re

from inferlab import measurements


def test_an_empty_or_missing_folder_says_so(tmp_path):
    assert measurements.load_measurements(tmp_path) == []
    assert measurements.load_measurements(tmp_path / "absent") == []
    assert "No measurements yet" in measurements.report_html(tmp_path)


def test_records_show_their_provenance_and_results(tmp_path):
    record = {"benchmark": "decode_gpu", "command": "python -m inferlab.benchmarks.decode_gpu",
              "model": "llama-2-7b", "dtype": "bfloat16", "batch": 1, "tokens_per_s": 123.456,
              "bandwidth_utilisation": {"of_datasheet_bandwidth": 0.71},
              "device": "cuda", "device_name": "NVIDIA H200", "table_row": "H200 SXM",
              "torch": "2.13.0", "cuda": "12.8", "threads": 16, "date": "2026-11-30",
              "driver": "570.1", "git_commit": "0123456789abcdef"}
    (tmp_path / "decode.json").write_text(json.dumps(record))
    (tmp_path / "sweep.json").write_text(json.dumps(
        {"benchmark": "kv_cache", "device_name": "AMD EPYC", "results": [{"context": 64, "speedup": 3.5}]}))
    (tmp_path / "broken.json").write_text("{not json")
    entries = measurements.load_measurements(tmp_path)
    assert [e["file"] for e in entries] == ["broken.json", "decode.json", "sweep.json"]
    rows = [measurements.provenance_row(e) for e in entries]
    assert rows[0]["benchmark"].startswith("unreadable")
    assert rows[1]["device_name"] == "NVIDIA H200" and rows[1]["git_commit"] == "0123456789"
    scalars, table = measurements.results_of(record)
    assert scalars["tokens_per_s"] == 123.456
    assert scalars["bandwidth_utilisation.of_datasheet_bandwidth"] == 0.71
    assert "torch" not in scalars and table == []
    assert measurements.results_of(entries[2]["record"])[1] == [{"context": 64, "speedup": 3.5}]
    page = measurements.report_html(tmp_path)
    for text in ("NVIDIA H200", "570.1", "2026-11-30", "123.5", "speedup", "unreadable"):
        assert text in page


def test_write_record_adds_provenance(tmp_path):
    import json

    from inferlab.analysis.hardware import detect_device
    from inferlab.measurements import default_path, write_record

    info = detect_device("cpu")
    out = write_record({"benchmark": "toy", "results": [1, 2]}, info, tmp_path / "toy.json")
    record = json.loads(out.read_text())
    assert record["benchmark"] == "toy" and record["results"] == [1, 2]
    for key in ("device_name", "torch", "date", "threads", "driver", "git_commit"):
        assert key in record
    path = default_path("toy", info)
    assert path.parent.name == "measurements" and path.name.startswith("toy_")
    assert path.name.endswith(f"_{record['date']}.json")


def test_the_page_shows_results_not_notes_and_turns_wide_rows_on_their_side(tmp_path):
    """A record's notes for its maintainers stay in the file; nested results become columns
    (the load-generator agreement record once showed Python dict reprs); a table with more
    columns than rows and than fit is turned on its side, one column a row."""
    rows = [{"regime": {"name": name, "rate": rate}, "ttft": {"engine_s": 0.01 * rate,
                                                               "loadgen_s": 0.02 * rate},
             "tpot": {"engine_s": 0.003, "loadgen_s": 0.0031}, "failed": 0}
            for name, rate in (("light", 2.0), ("busy", 8.0))]
    record = {"benchmark": "loadgen_agreement", "note": "reniced to 0 after 10 minutes",
              "seconds_source": "read from the console", "speed": {"x": 1.5, "x_note": "hm"},
              "results": rows, "device_name": "AMD EPYC", "date": "2026-12-02"}
    (tmp_path / "agree.json").write_text(json.dumps(record))
    entry = measurements.load_measurements(tmp_path)[0]
    scalars, shown = measurements.shown_results(record)
    assert scalars == {"speed.x": 1.5}
    assert shown[0]["ttft.engine_s"] == 0.02 and "regime" not in shown[0]
    page = measurements.record_html(entry)
    assert "reniced" not in page and "console" not in page and "{" not in page
    assert "<th>light</th><th>busy</th>" in page            # one column a row, named by it
    assert "ttft.<wbr>engine_<wbr>s" in page                 # a long key breaks at its joints
    narrow = measurements.rows_html([{"a": 1, "b": 2}, {"a": 3, "b": 4}])
    assert "<th>a</th><th>b</th>" in narrow                  # a narrow table stays as it is
    assert measurements.breakable("2.13.0+cpu") == "2.13.0+cpu"   # never inside a number


def test_every_benchmark_says_how_a_gpu_records_it(tmp_path):
    """A benchmark no GPU has run says which command records it on one; each command is one
    its module's own parser accepts."""
    from inferlab.benchmarks.gpu_suite import parse_only

    cpu = {"benchmark": "paged", "device_name": "AMD EPYC", "date": "2026-12-01", "cuda": None}
    gpu = {**cpu, "device_name": "NVIDIA H200", "cuda": "12.8", "date": "2026-12-02"}
    page = measurements.benchmarks_html([{"file": "a.json", "record": cpu, "error": None}])
    row = next(r for r in page.split("<tr>") if "<b>paged</b>" in r)
    text = re.sub(r"<[^>]+>", "", row)                      # as the browser shows it
    assert "AMD EPYC (2026-12-01)" in text and "not yet: on a CUDA GPU" in text
    assert "python -m inferlab.benchmarks.paged --device cuda" in text
    assert '<span style="white-space: nowrap">--device</span>' in row   # no break after "-"
    page = measurements.benchmarks_html([{"file": "b.json", "record": gpu, "error": None}])
    row = next(r for r in page.split("<tr>") if "<b>paged</b>" in r)
    assert "yes: NVIDIA H200 (2026-12-02)" in re.sub(r"<[^>]+>", "", row)
    for bench in measurements.BENCHMARKS:
        if bench.gpu_command is None:
            continue
        words = bench.gpu_command.split()
        assert words[:2] == ["python", "-m"] and words[2].startswith("inferlab.benchmarks.")
        parse_only(words[2].rsplit(".", 1)[1], words[3:])     # raises if the parser refuses


def test_the_engine_facts_table_breaks_only_at_joints():
    """The status page's engine facts: a commit read is shown by its first 12 characters (the
    40-character hash was one unbreakable word that pushed the table 185 pixels past the
    column), a long hyphenated name may break after a hyphen inside it, "+" between two words
    is a joint, and each row links its page and its source."""
    import datetime as dt

    row = {"key": "k", "engine": "DeepEP",
           "version": "commit 0297fc801788b14b338a46554faca28d419e518a",
           "claim": "sets x-gateway-inference-objective on weights+activations",
           "read_on": "2026-11-30",
           "source": "https://github.com/deepseek-ai/DeepEP/blob/0297fc8/README.md",
           "where": "README", "chapter": "ch10_parallel"}
    page = measurements.facts_html([row], {"ch10_parallel": "ch. 10"}, dt.date(2026, 12, 2))
    text = re.sub(r"<[^>]+>", "", page)
    assert "DeepEP commit 0297fc801788" in text and "0297fc801788b" not in text
    assert "(2&nbsp;d)" in text and ">ch.&nbsp;10</a>" in page
    assert 'href="ch10_parallel.html"' in page
    assert "gateway-</span><wbr>" in page and "weights+<wbr>activations" in page
    assert measurements.breakable("--random-input-len-and-more").startswith(
        '<span style="white-space: nowrap">--random-</span><wbr>')   # never after "--" alone
    assert measurements.breakable("0.12.0") == "0.12.0"
    digest = "1948e2d48b0e7377f1bb5f1210f1ae5f984934e75713fc07e2452729b8365316"  # a sha256
    assert measurements.breakable(digest).split("<wbr>") == [digest[i:i + 16]
                                                             for i in range(0, 64, 16)]
    assert "<wbr>" not in measurements.breakable("40b0e7377f1bb5f1210f1ae5f98")  # 27: whole
