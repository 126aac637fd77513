"""The status page's measurement tables: empty folder, a record with provenance, a broken file."""

import json

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
