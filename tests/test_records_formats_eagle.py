"""The committed records of the formats benchmark, the EAGLE head's training and its speculative
benchmark parse, name the command that wrote them, carry their provenance, and hold together."""

import json
import math

import pytest

from inferlab.measurements import measurements_folder

PROVENANCE = ("device_name", "torch", "date", "git_commit", "command", "threads")


def _records(benchmark):
    folder = measurements_folder()
    found = []
    for path in sorted(folder.glob("*.json")) if folder else []:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("benchmark") == benchmark:
            found.append(record)
    if not found:
        pytest.fail(f"no committed record of the {benchmark!r} benchmark in data/measurements")
    return found


@pytest.mark.parametrize("name, module", [("formats", "inferlab.benchmarks.formats"),
                                               ("eagle", "inferlab.benchmarks.eagle"),
                                               ("eagle_training", "inferlab.model.train_eagle")])
def test_record_names_its_command_and_provenance(name, module):
    for record in _records(name):
        assert record["command"].startswith(f"python -m {module}")
        for key in PROVENANCE:
            assert record.get(key) not in (None, ""), key


def test_formats_record_rows():
    for record in _records("formats"):
        rows = {r["format"]: r for r in record["results"]}
        assert rows["bfloat16 (stored)"]["rise"] == 0
        assert rows["mxfp4 (32, E8M0 scale)"]["bits_per_number"] == pytest.approx(4.25)
        assert 4.5 <= rows["nvfp4 (16, E4M3 scale + FP32)"]["bits_per_number"] < 4.51
        for r in record["results"]:
            assert math.isfinite(r["perplexity"]) and r["perplexity"] > 1
            assert r["perplexity"] == pytest.approx(rows["bfloat16 (stored)"]["perplexity"]
                                                    * (1 + r["rise"]))
        assert {r["applies_to"] for r in record["results"]} >= {"weights", "kv cache"}


def test_eagle_record_rows():
    for record in _records("eagle"):
        kinds = {r["drafter"] for r in record["results"]}
        assert kinds == {"eagle", "draft"}
        for r in record["results"]:
            assert 0 <= r["acceptance"] <= 1
            assert 1 <= r["tokens_per_verification"] <= r["k"] + 1
            assert r["speedup"] > 0
        for kind, by_t in record["acceptance_by_temperature"].items():
            assert set(by_t) == {"0.0", "0.5", "1.0"}
            assert all(0 <= a <= 1 for a in by_t.values())


def test_eagle_training_record_matches_the_committed_head():
    from inferlab.model.weights import checkpoint_path

    head = checkpoint_path("course-target").parent / "course-eagle"
    config = json.loads((head / "config.json").read_text(encoding="utf-8"))
    for record in _records("eagle_training"):
        assert record["plan"]["steps"] == record["results"][-1]["step"]
        assert config["target_model"] == "course-target"
        assert record["bytes_on_disk"] == sum(f.stat().st_size for f in head.iterdir())
