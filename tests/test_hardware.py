"""The hardware table, device detection, profiles, timing and the probes (on the CPU)."""

import pytest
import torch

from inferlab import device as dev
from inferlab.analysis.hardware import (detect_device, get_device_spec, load_hardware,
    match_device_name, measure_bandwidth, measure_peak_flops)
from inferlab.timing import time_fn


def test_every_table_row_has_a_source_and_positive_numbers():
    specs = load_hardware()
    assert len(specs) >= 10
    for spec in specs.values():
        assert spec.source.strip(), spec.name
        assert spec.bandwidth > 0
        assert spec.peak_bf16 is None or spec.peak_bf16 > 0


@pytest.mark.parametrize("name, bandwidth_gbs, tflops", [
    ("T4", 320, None), ("L4", 300, 121), ("A100 40GB SXM", 1555, 312),
    ("A100 80GB SXM", 2039, 312), ("H100 SXM", 3350, 989), ("H100 PCIe", 2000, 756),
    ("H200 SXM", 4800, 989), ("B200", 8000, 2250), ("MI300X", 5300, 1307)])
def test_table_matches_facts(name, bandwidth_gbs, tflops):
    spec = get_device_spec(name)
    assert spec.bandwidth == pytest.approx(bandwidth_gbs * 1e9)
    if tflops is None:
        assert spec.peak_flops("bfloat16") is None  # the T4 has no BF16
        assert spec.peak_flops("float16") == pytest.approx(65e12)
    else:
        assert spec.peak_flops("bfloat16") == pytest.approx(tflops * 1e12)


def test_int8_peaks_are_the_dense_datasheet_figures():
    """INT8 tensor cores (data/hardware_int8.csv): Ampere's only 8-bit arithmetic, 624 dense TOPS
    on an A100 (as many OPs as its FP16 FLOPs, twice); Hopper's INT8 rate equals its FP8 rate.
    A row without a sourced figure has no INT8 peak, rather than a guess."""
    for name in ("A100 40GB SXM", "A100 80GB SXM"):
        spec = get_device_spec(name)
        assert spec.peak_flops("int8") == pytest.approx(624e12) == 2 * spec.peak_flops("bfloat16")
        assert spec.peak_flops("fp8") is None                 # Ampere has no FP8 tensor cores
    for name in ("H100 SXM", "H200 SXM"):
        spec = get_device_spec(name)
        assert spec.peak_flops("int8") == pytest.approx(1979e12) == spec.peak_flops("fp8")
    assert get_device_spec("L4").peak_flops("int8") is None


@pytest.mark.parametrize("torch_name, row", [
    ("Tesla T4", "T4"), ("NVIDIA L4", "L4"), ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200 SXM"),
    # names that contain another row's name: a substring match picked the wrong roofline
    ("NVIDIA L40S", "L40S"), ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"), ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("AMD Instinct MI300X", "MI300X")])
def test_device_names_torch_reports_are_recognised(torch_name, row):
    assert match_device_name(torch_name).name == row


@pytest.mark.parametrize("torch_name", ["NVIDIA H200 NVL", "NVIDIA L40", "NVIDIA L4X",
                                        "NVIDIA GH200 144G HBM3e", "NVIDIA A100 80GB PCIe MIG"])
def test_a_name_the_table_lacks_gets_no_neighbours_row(torch_name):
    assert match_device_name(torch_name) is None


def test_the_a100_pcie_has_its_own_bandwidth():
    assert match_device_name("NVIDIA A100 80GB PCIe").bandwidth == pytest.approx(1935e9)
    assert match_device_name("NVIDIA A100-SXM4-80GB").bandwidth == pytest.approx(2039e9)


MIB = 2**20


@pytest.mark.parametrize("name, total_mib, reserved_mib", [
    ("H100 SXM", 81559, 454), ("H200 SXM", 143771, 700), ("A100 80GB SXM", 81920, 763),
    ("L4", 23034, 556), ("L40S", 46068, 479), ("GH200", 97871, 1103)])
def test_usable_memory_is_what_the_driver_reports_less_its_reserve(name, total_mib,
                                                                    reserved_mib):
    """nvidia-smi -a on real cards (data/hardware.csv names each source). An HBM card's
    nominal "80GB" is binary, so its usable bytes exceed the datasheet's figure read as decimal
    GB; a GDDR6 card's (L4, L40S) fall a little short of it."""
    spec = get_device_spec(name)
    assert spec.memory == (total_mib - reserved_mib) * MIB
    assert spec.memory_reserved == reserved_mib * MIB
    assert spec.memory_source
    if spec.memory_kind == "HBM":   # HBM's nominal size is binary: more than the decimal GB
        assert spec.memory > spec.memory_nominal


def test_rows_without_a_reported_size_fall_back_to_the_datasheet():
    t4 = get_device_spec("T4")
    assert t4.memory == t4.memory_nominal == 16e9 and t4.memory_source == ""
    assert t4.memory_reserved is None


def test_an_h100_holds_about_seven_percent_more_than_80_decimal_gb():
    assert get_device_spec("H100 SXM").memory / 80e9 == pytest.approx(1.063, abs=0.001)


def test_unknown_device_lists_the_known_ones():
    assert match_device_name("NVIDIA GeForce GTX 480") is None
    with pytest.raises(ValueError, match="the hardware table knows: T4, L4"):
        get_device_spec("GTX 480")


def test_detect_cpu():
    info = detect_device("cpu")
    assert info.device == "cpu" and info.spec is None and info.name
    prov = info.provenance()
    assert prov["torch"] == torch.__version__ and prov["date"]
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        detect_device("tpu")


def test_profiles_and_their_refusals(monkeypatch):
    monkeypatch.delenv("INFERLAB_PROFILE", raising=False)
    if not torch.cuda.is_available():
        assert dev.choose_profile().name == "cpu"
    monkeypatch.setenv("INFERLAB_PROFILE", "small-gpu")
    if torch.cuda.is_available():
        assert dev.choose_profile().dtype == torch.float16
    else:
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            dev.choose_profile()
    assert dev.get_profile("small-gpu").dtype == torch.float16
    monkeypatch.setenv("INFERLAB_PROFILE", "huge")
    with pytest.raises(ValueError, match="choose one of \\['cpu', 'large-gpu', 'small-gpu'\\]"):
        dev.choose_profile()
    with pytest.raises(ValueError, match="must be positive"):
        dev.PROFILES["cpu"].scaled(max_batch=0)


def test_dtypes():
    assert dev.parse_dtype("bfloat16") is torch.bfloat16
    assert dev.parse_dtype(torch.float32) is torch.float32
    assert dev.bytes_per_element("float16") == 2
    with pytest.raises(ValueError, match="unknown dtype 'half'.*bfloat16"):
        dev.parse_dtype("half")
    with pytest.raises(ValueError, match="float16 is not supported on cpu; pass one of: float32, bfloat16"):
        dev.check_dtype("float16", "cpu")


def test_time_fn_measures_something_sensible():
    x = torch.randn(256, 256)
    t = time_fn(lambda: x @ x, min_run_time=0.05)
    assert 0 < t.median_s and t.runs >= 1
    with pytest.raises(ValueError, match="positive seconds"):
        time_fn(lambda: None, min_run_time=0)
    with pytest.raises(TypeError, match="function of no arguments"):
        time_fn(42)


def test_probes_on_cpu_report_plausible_figures_with_provenance():
    bw = measure_bandwidth("cpu", n_bytes=32 * 2**20, min_run_time=0.05)
    assert 1e8 < bw.value < 1e13 and bw.unit == "B/s"
    assert bw.to_dict()["device"] == "cpu"
    flops = measure_peak_flops("float32", "cpu", n=256, min_run_time=0.05)
    assert 1e8 < flops.value < 1e14 and flops.dtype == "float32"
    assert "GFLOP/s" in str(flops) or "TFLOP/s" in str(flops)


def test_probes_refuse_bad_sizes_and_dtypes():
    with pytest.raises(ValueError, match="at least 1 MiB"):
        measure_bandwidth("cpu", n_bytes=1000)
    with pytest.raises(ValueError, match="n >= 64"):
        measure_peak_flops("float32", "cpu", n=8)
    with pytest.raises(ValueError, match="not supported on cpu"):
        measure_peak_flops("float16", "cpu", n=128)


def test_capacity_counts_use_the_usable_memory():
    """Llama-2-70B's bf16 weights (138.0 GB) on an H200: the 141 GB of the datasheet read as
    decimal GB leave about 3 GB; the 143,071 MiB the driver lets a program have leave about
    12 GB, room for 8 requests of 4,096 tokens at 320 KiB per token instead of 2."""
    from inferlab.analysis import formulas
    from inferlab.analysis.capacity import capacity
    from inferlab.model.config import ModelConfig
    c = capacity("llama-2-70b", "H200 SXM", context=4096, activation_reserve=0,
                 memory_utilization=1.0)
    assert c.device_memory == 143071 * MIB
    assert c.kv_budget / 1e9 == pytest.approx(12.07, abs=0.01)
    assert c.max_requests == 8
    nominal = formulas.max_concurrent_requests(ModelConfig.from_name("llama-2-70b"), 141e9, 4096)
    assert nominal == 2
