"""Collectives (inferlab.analysis.collectives): the bytes each algorithm moves, NCCL's own
latency model by hand, the engines' custom all-reduce fitted to its published timings and used
where an engine uses it, and DeepEP's dispatch and combine checked against its published
bandwidths."""

import math

import pytest

from inferlab.analysis import collectives as c
from inferlab.data import read_table

NVLINK = c.Link.named("NVLink H100")
NIC = c.Link.named("RDMA NIC per GPU (400G)")


def test_each_algorithm_moves_its_bytes():
    # ring and two-shot: 2 (N - 1) / N of the message per rank; one-shot: every peer's buffer
    assert c.ring_bytes(800, 8) == 1400
    assert c.ring_bytes(800, 2) == 800
    assert c.one_shot_bytes(800, 8) == 5600
    assert c.one_shot_bytes(800, 8) / c.ring_bytes(800, 8) == 4  # N / 2 times more at N = 8


def test_nccl_ring_by_its_own_model():
    # NCCL 2.30.7 tuning.cc: ring LL on NVLink, 6.6 us + 2 (N - 1) x 0.6 us, half the bus bandwidth
    small = c.nccl_all_reduce(NVLINK, 16384, 8)
    assert small.how == "NCCL ring, LL"
    assert small.latency_s == pytest.approx((6.6 + 14 * 0.6) * 1e-6)
    assert small.transfer_s == pytest.approx(1.75 * 16384 / (0.5 * 365e9))
    # the latency grows with the ring: 2 (N - 1) hops
    assert c.nccl_all_reduce(NVLINK, 16384, 2).latency_s == pytest.approx((6.6 + 2 * 0.6) * 1e-6)
    # a large message takes the Simple protocol, which has the whole bandwidth
    big = c.nccl_all_reduce(NVLINK, 256 * 2**20, 8)
    assert big.how == "NCCL ring, Simple"
    assert big.transfer_s == pytest.approx(1.75 * 256 * 2**20 / 365e9)
    # both protocols priced, the faster taken
    for size in (1e3, 1e6, 1e8):
        both = [c.nccl_all_reduce(NVLINK, size, 8, p).seconds for p in ("LL", "Simple")]
        assert c.nccl_all_reduce(NVLINK, size, 8).seconds == min(both)
    # slower links have slower hops: PCIe 1.0 us, a network step 5.0 us (one GPU per server)
    pcie, ib = c.Link.named("PCIe Gen5 x16"), c.Link.named("InfiniBand NDR")
    assert c.all_reduce(pcie, 16384, 8).latency_s == pytest.approx((6.6 + 14 * 1.0) * 1e-6)
    assert c.all_reduce(ib, 16384, 8).latency_s == pytest.approx((6.6 + 14 * 5.0) * 1e-6)
    # no link class: no latency, the ring's bytes at the line rate
    ideal = c.all_reduce(c.Link.ideal(100e9), 1e6, 4)
    assert ideal.latency_s == 0 and ideal.transfer_s == pytest.approx(1.5e6 / 100e9)
    assert c.all_reduce(c.Link.ideal(math.inf), 1e6, 4).seconds == 0


def test_the_custom_all_reduce_fit_follows_its_published_timings():
    fits = c.custom_fits()
    assert set(fits) == {("NVLink H100", n) for n in (2, 4, 8)}
    for row in read_table("allreduce_timings.csv"):
        latency, bandwidth = fits[(row["link"], int(row["devices"]))]
        fitted = latency + float(row["bytes"]) / bandwidth
        assert fitted == pytest.approx(float(row["time_us"]) * 1e-6, rel=0.4), row
    # the latency is a few microseconds and grows with the group; the effective bandwidth is far
    # below NVLink's 450 GB/s line rate at these sizes
    assert 3e-6 < fits[("NVLink H100", 2)][0] < fits[("NVLink H100", 8)][0] < 8e-6
    assert all(bw < 100e9 for _, bw in fits.values())


def test_engines_use_the_custom_kernel_only_where_vllm_does():
    assert c.all_reduce(NVLINK, 16384, 8).how.startswith("custom")
    assert c.all_reduce(NVLINK, 16384, 6).how.startswith("custom")       # between 4 and 8
    assert c.all_reduce(NVLINK, 16384, 16).how.startswith("NCCL")        # not 2, 4, 6 or 8
    assert c.all_reduce(NVLINK, 8 * 2**20, 8).how.startswith("NCCL")     # at vLLM's max size
    assert c.all_reduce(c.Link.named("PCIe Gen5 x16"), 16384, 2).how.startswith("NCCL")
    assert c.all_reduce(c.Link.named("NVLink A100"), 16384, 8).how.startswith("NCCL")  # no timings
    assert c.all_reduce(NVLINK, 16384, 1).seconds == 0


def test_deepep_bytes_per_token_reproduce_its_published_bandwidths():
    """DeepEP's logical bandwidth is (tokens x top-k rows) / time: with FP8 rows carrying one
    4-byte scale per 128 channels at the dispatch and bf16 rows at the combine, the course's
    byte count over DeepEP's published times gives DeepEP's published bandwidths."""
    a2a = c.ExpertAllToAll(144, 8, 7168, NIC, layers=58)
    assert a2a.bytes_per_token("dispatch") == 8 * 7168 * (1 + 4 / 128) == 59136
    assert a2a.bytes_per_token("combine") == 8 * 7168 * 2
    for row in c.deepep_rows():
        x = c.ExpertAllToAll(int(row["ep"]), int(row["topk"]), int(row["hidden"]), NIC)
        for phase in ("dispatch", "combine"):
            logical = row["tokens"] * x.bytes_per_token(phase) / (row[f"{phase}_us"] * 1e-6)
            assert logical == pytest.approx(row[f"{phase}_gbs"] * 1e9, rel=0.03), (row, phase)


def test_the_all_to_all_prices_remote_rows_at_the_nic_and_the_rest_as_latency():
    a2a = c.ExpertAllToAll(144, 8, 7168, NIC)
    assert a2a.remote_share == pytest.approx(136 / 144)     # 8 of 144 GPUs share a node
    for row in c.deepep_rows():          # at DeepEP's own widths and batch: its own times
        x = c.ExpertAllToAll(int(row["ep"]), 8, 7168, NIC)
        for phase in ("dispatch", "combine"):
            assert x.cost(phase, row["tokens"]).seconds == pytest.approx(row[f"{phase}_us"] * 1e-6)
    for phase in ("dispatch", "combine"):
        # the latency is what the line rate leaves over: tens of microseconds, the same order
        # at every published width from 16 up
        assert 30e-6 < a2a.latency_s(phase) < 100e-6
        assert a2a.cost(phase, 0).seconds == a2a.latency_s(phase)
    with pytest.raises(ValueError, match="EP"):
        c.ExpertAllToAll(512, 8, 7168, NIC).latency_s("dispatch")
