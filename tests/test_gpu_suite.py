"""The GPU suite's plumbing, checked on the CPU in seconds: the plan for both GPU profiles, the
benchmark registry, argument checking by each benchmark's own parser, budgets that kill, the
reading of each part's result, the records and the summary. No GPU part runs here."""

import json
import sys

import pytest
import torch

from inferlab.analysis.hardware import detect_device
from inferlab.benchmarks import gpu_suite
from inferlab.course import catalog, results


def test_without_cuda_every_part_is_skipped_saying_why_and_a_summary_is_written(tmp_path, root):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the suite would run")
    before = sorted((root / "data" / "measurements").glob("*.json"))
    assert gpu_suite.main(["--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    parts = summary["parts"]
    assert {p["kind"] for p in parts} == {"lab", "benchmark"}
    assert len([p for p in parts if p["kind"] == "lab"]) == len(catalog.labs(root))
    assert {p["name"] for p in parts if p["kind"] == "benchmark"} == \
        {b.name for b in gpu_suite.BENCHMARKS}
    assert all(p["status"] == "skipped" and "CUDA" in p["detail"] for p in parts)
    assert len(summary["checked"]) == 3 and summary["dtype"] == "bfloat16"
    markdown = (tmp_path / "summary.md").read_text()
    assert markdown.count("| skipped |") == len(parts) and "Checked without a GPU" in markdown
    assert sorted((root / "data" / "measurements").glob("*.json")) == before  # nothing recorded


@pytest.mark.parametrize("profile, dtype, decode_model", [("large-gpu", "bfloat16", "llama-2-7b"),
                                                          ("small-gpu", "float16", "medium")])
def test_the_plan_for_each_gpu_profile(tmp_path, root, profile, dtype, decode_model):
    parts = gpu_suite.plan(profile, dtype, tmp_path, "nvidia-x", "2030-01-01")
    assert sum(p.budget_s for p in parts) <= gpu_suite.TOTAL_BUDGET_S - gpu_suite.SUITE_MARGIN_S
    labs = [p for p in parts if p.kind == "lab"]
    assert [p.name for p in labs] == [lab.stem for lab in catalog.labs(root)]
    assert all(p.command[p.command.index("--profile") + 1] == profile for p in labs)
    benches = {p.name: p for p in parts if p.kind == "benchmark"}
    decode = benches["decode_gpu"].command
    assert decode[decode.index("--model") + 1] == decode_model
    for p in benches.values():
        assert p.command[p.command.index("--dtype") + 1] == dtype
        assert p.record.endswith(f"_nvidia-x_2030-01-01_{profile}.json")
        assert str(root / "data" / "measurements") in p.record
    assert gpu_suite.gpu_dtype("small-gpu") == "float16"  # a T4 has no bfloat16


def test_a_benchmark_joins_with_one_entry_and_its_arguments_are_checked(monkeypatch, tmp_path):
    extra = gpu_suite.Benchmark("kv_cache", "--json", 5, "--contexts 8 --dtype {dtype}", "a test")
    monkeypatch.setattr(gpu_suite, "BENCHMARKS", (*gpu_suite.BENCHMARKS, extra))
    # make room for the extra benchmark within the suite's budget
    monkeypatch.setitem(gpu_suite.LAB_BUDGET_S, "04_batching", gpu_suite.LAB_BUDGET_S["04_batching"] - 10)
    parts = gpu_suite.plan("large-gpu", "bfloat16", tmp_path, "x", "2030-01-01")
    assert parts[-1].name == "kv_cache" and parts[-1].command[-2] == "--json"
    assert len(gpu_suite.check_plumbing(tmp_path)) == 3
    typo = gpu_suite.Benchmark("kv_cache", "--json", 5, "--cotnexts 8", "a misspelt option")
    monkeypatch.setattr(gpu_suite, "BENCHMARKS", (*gpu_suite.BENCHMARKS[:-1], typo))
    with pytest.raises(ValueError, match="kv_cache rejects"):
        gpu_suite.check_plumbing(tmp_path)
    with pytest.raises(ValueError, match="rejects"):
        gpu_suite.parse_only("decode_gpu", ["--no-such-option"])
    options = gpu_suite.parse_only("paged", ["--device", "cuda", "--batch", "4"])
    assert options["batch"] == 4 and options["device"] == "cuda"
    greedy = gpu_suite.Benchmark("kv_cache", "--json", 400, "--contexts 8", "too slow")
    monkeypatch.setattr(gpu_suite, "BENCHMARKS", (*gpu_suite.BENCHMARKS[:-1], greedy))
    with pytest.raises(ValueError, match="over the suite's"):
        gpu_suite.plan("large-gpu", "bfloat16", tmp_path, "x", "2030-01-01")


def test_a_part_over_its_budget_is_killed(tmp_path):
    part = gpu_suite.Part("benchmark", "sleeper", 1,
                          [sys.executable, "-c", "import time; time.sleep(60)"], str(tmp_path / "r.json"))
    gpu_suite.run_part(part, {}, tmp_path / "logs")
    assert part.status == "timed out" and part.seconds < 10
    assert (tmp_path / "logs" / "benchmark_sleeper.log").is_file()


def test_a_benchmark_part_reads_its_record_and_a_failure_says_why(tmp_path):
    record = tmp_path / "decode.json"
    script = ("import json, sys; json.dump({'benchmark': 'decode_gpu', 'best_tokens_per_s': 41.5,"
              " 'errors': {'compiled': 'no compiler'}}, open(sys.argv[1], 'w'))")
    part = gpu_suite.Part("benchmark", "decode_gpu", 30,
                          [sys.executable, "-c", script, str(record)], str(record))
    gpu_suite.run_part(part, {}, tmp_path / "logs")
    assert part.status == "passed" and part.results == {"best_tokens_per_s": 41.5}
    assert "no compiler" in part.detail
    broken = gpu_suite.Part("benchmark", "paged", 30, [sys.executable, "-c", "raise SystemExit(3)"],
                            str(tmp_path / "missing.json"))
    gpu_suite.run_part(broken, {}, tmp_path / "logs")
    assert broken.status == "failed" and "exit status 3" in broken.detail


def _report(run, passed, errors=()):
    exercises = [results.ExerciseResult(str(i), results.PASSED if i < passed else results.FAILED)
                 for i in range(3)]
    nb = results.NotebookResult("solutions/x.ipynb", run, "", 12.5, "lab01", exercises, list(errors))
    return json.dumps({"exit_status": 0, "notebooks": [nb.to_dict()]})


def test_a_lab_passes_only_when_it_ran_to_the_end_without_an_error(tmp_path):
    ok = gpu_suite.Part("lab", "01_roofline", 60, [])
    gpu_suite._read_lab(ok, _report(results.COMPLETED, 3))
    assert ok.status == "passed" and ok.results["passed"] == 3
    error = {"cell": 7, "ename": "OutOfMemoryError", "evalue": "CUDA out of memory"}
    bad = gpu_suite.Part("lab", "02_kv_cache", 60, [])
    gpu_suite._read_lab(bad, _report(results.COMPLETED, 3, [error]))
    assert bad.status == "failed" and "cell 7 raised OutOfMemoryError" in bad.detail
    short = gpu_suite.Part("lab", "04_batching", 60, [])
    gpu_suite._read_lab(short, _report(results.TIMED_OUT, 1))
    assert short.status == "failed" and "1/3" in short.detail
    garbled = gpu_suite.Part("lab", "03_paged_attention", 60, [])
    gpu_suite._read_lab(garbled, "Traceback: nothing useful")
    assert garbled.status == "failed"


def test_the_labs_record_and_the_summary(tmp_path):
    parts = [gpu_suite.Part("lab", "01_roofline", 60, [], status="passed", seconds=21.0,
                            results={"run": "completed", "exercises": 5, "passed": 5,
                                     "cell_errors": []}),
             gpu_suite.Part("benchmark", "paged", 35, [], status="timed out", seconds=35.2,
                            detail="killed after its 35 s budget")]
    path = gpu_suite.record_labs(parts, "small-gpu", detect_device("cpu"), "2030-01-01", "x",
                                 folder=tmp_path)
    record = json.loads(path.read_text())
    assert record["benchmark"] == "lab_times" and record["profile"] == "small-gpu"
    assert {"device", "torch", "date", "git_commit", "driver"} <= set(record)
    assert record["results"][0]["wall_s"] == 21.0 and record["results"][0]["passed"] == 5
    header = {"device": "GPU X", "profile": "small-gpu", "dtype": "float16", "torch": "2.x",
              "cuda": "12.x", "driver": "570", "git_commit": "abc", "date": "2030-01-01",
              "seconds": 60.0, "checked": []}
    js, md = gpu_suite.write_summary(tmp_path / "out", header, parts)
    assert json.loads(js.read_text())["parts"][1]["status"] == "timed out"
    text = md.read_text()
    assert "| lab 01_roofline | passed | 21.0 | 60 |" in text and "killed after" in text
