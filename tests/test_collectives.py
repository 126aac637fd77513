"""Collectives (inferlab.analysis.collectives): the bytes each algorithm moves, NCCL's own
ring-and-tree model by hand, vLLM's NVLink kernels fitted to its published CUDA-graph timings
and used where vLLM uses them, and DeepEP's dispatch and combine in both of its bounds, checked
against its published tables of both kernel versions."""

import math

import pytest

from inferlab.analysis import collectives as c
from inferlab.data import read_table

NVLINK = c.Link.named("NVLink H100")
PCIE = c.Link.named("PCIe Gen5 x16")
IB = c.Link.named("InfiniBand NDR")                     # one GPU a server
IB8 = c.Link.named("InfiniBand NDR, 8 H100s a server")  # 8 GPUs a server on NVLink
NIC = c.Link.named("RDMA NIC per GPU (400G)")


def test_each_algorithm_moves_its_bytes():
    # ring and two-shot: 2 (N - 1) / N of the message per rank; one-shot: every peer's buffer
    assert c.ring_bytes(800, 8) == 1400
    assert c.ring_bytes(800, 2) == 800
    assert c.one_shot_bytes(800, 8) == 5600
    assert c.one_shot_bytes(800, 8) / c.ring_bytes(800, 8) == 4  # N / 2 times more at N = 8
    # each priced call reports its algorithm's bytes
    assert c.all_reduce(NVLINK, 16384, 8).bytes == c.one_shot_bytes(16384, 8)   # below 256 KiB
    assert c.all_reduce(NVLINK, 2**20, 8).bytes == c.ring_bytes(2**20, 8)       # multimem above
    assert c.nccl_all_reduce(IB, 16384, 8, "LL", "tree").bytes == 2 * 16384
    assert c.nccl_all_reduce(IB, 16384, 8, "LL", "ring").bytes == c.ring_bytes(16384, 8)


def test_nccl_ring_and_tree_by_its_own_model():
    # NCCL 2.30.7 tuning.cc, one GPU a server (ppn = 1): a ring's 14 steps all cross the network
    # at the tree's NET latency, 6.6 + 14 x 5.0 us; a tree pays 2 log2(8) network hops, 6.8 + 30
    ring = c.nccl_all_reduce(IB, 16384, 8, "LL", "ring")
    tree = c.nccl_all_reduce(IB, 16384, 8, "LL", "tree")
    assert ring.latency_s == pytest.approx(76.6e-6)
    assert tree.latency_s == pytest.approx(36.8e-6)
    # LL's bus bandwidth: half the bus, capped at llMaxBw (20.4 GB/s beyond two nodes)
    assert ring.transfer_s == pytest.approx(1.75 * 16384 / min(0.5 * 46e9, 20.4e9))
    # a tree moves 2 S at half its bus bandwidth x 0.92 / 3.8, with the size's correction (0.7)
    assert tree.transfer_s == pytest.approx(2 * 16384 / (min(46e9 * 0.92 / 3.8, 20.4e9) * 0.7),
                                            rel=1e-5)   # the table keeps six digits
    assert c.nccl_all_reduce(IB, 16384, 8).how == "NCCL tree, LL"      # NCCL runs the faster
    # one server of 8 on NVLink: every hop is NVLink's, 6.6 + 14 x 0.6; LL capped at 141 GB/s
    small = c.nccl_all_reduce(NVLINK, 16384, 8, "LL", "ring")
    assert small.latency_s == pytest.approx((6.6 + 14 * 0.6) * 1e-6)
    assert small.transfer_s == pytest.approx(1.75 * 16384 / 141e9)
    # two servers of 8 (TP 16): 28 NVLink steps at max(0.6, 1.0 us net overhead) and 2 network
    # steps at the ring's NET latency 2.7 us; the tree: 2 (7 x 0.6 + 1 x 5.0)
    assert c.nccl_all_reduce(IB8, 16384, 16, "LL", "ring").latency_s == pytest.approx(
        (6.6 + 28 * 1.0 + 2 * 2.7) * 1e-6)
    assert c.nccl_all_reduce(IB8, 16384, 16, "LL", "tree").latency_s == pytest.approx(
        (6.8 + 2 * (7 * 0.6 + 5.0)) * 1e-6)
    # LL128 is off between PCIe-only GPUs; every protocol and algorithm is priced, the fastest run
    with pytest.raises(ValueError):
        c.nccl_all_reduce(PCIE, 16384, 8, "LL128", "ring")
    for link, n in ((NVLINK, 8), (PCIE, 8), (IB, 8), (IB8, 16)):
        for size in (1e3, 1e6, 1e8):
            every = [c._nccl_price(link, size, n, a, p) for a in ("ring", "tree")
                     for p in c.PROTOCOLS]
            assert c.nccl_all_reduce(link, size, n).seconds == min(
                x.seconds for x in every if x is not None)
    # a large message on NVLink takes a bandwidth protocol, at the measured 365 GB/s bus
    assert c.nccl_all_reduce(NVLINK, 256 * 2**20, 8).how in ("NCCL ring, LL128", "NCCL ring, Simple")
    # no link class: no latency, the ring's bytes at the line rate
    ideal = c.all_reduce(c.Link.ideal(100e9), 1e6, 4)
    assert ideal.latency_s == 0 and ideal.transfer_s == pytest.approx(1.5e6 / 100e9)
    assert c.all_reduce(c.Link.ideal(math.inf), 1e6, 4).seconds == 0


def test_the_nvlink_fit_follows_vllms_published_timings():
    latency, bandwidth = c.custom_fits()["NVLink H100"]
    rows = [r for r in read_table("allreduce_timings.csv")]
    assert {int(r["devices"]) for r in rows} == {6, 8}
    for row in rows:
        fitted = latency + float(row["bytes"]) / bandwidth
        assert fitted == pytest.approx(float(row["time_us"]) * 1e-6, rel=0.25), row
    # single-digit microseconds before the first byte, a few hundred GB/s of message after
    assert 5e-6 < latency < 15e-6 and 150e9 < bandwidth < 300e9


def test_engines_use_their_kernels_only_where_vllm_does():
    assert c.all_reduce(NVLINK, 16384, 8).how.startswith("vLLM one-shot")
    assert c.all_reduce(NVLINK, 2**20, 8).how.startswith("vLLM symmetric-memory")  # > 256 KiB
    assert c.all_reduce(NVLINK, 2**20, 4).how.startswith("vLLM two-shot")   # custom cap 8 MiB
    # CustomAllreduce's default max_size (8 MiB) caps the table's 64 and 32 MiB on 2 and 4 GPUs
    assert c.CUSTOM_MAX_BYTES == {2: 8 * 2**20, 4: 8 * 2**20, 6: 2**19, 8: 2**18}
    assert c.all_reduce(NVLINK, 16 * 2**20, 4).how.startswith("vLLM symmetric-memory")
    assert c.all_reduce(NVLINK, 64 * 2**20, 8).how.startswith("NCCL")       # symm-mem cap
    assert c.all_reduce(NVLINK, 16384, 16).how.startswith("NCCL")           # not 2, 4, 6 or 8
    assert c.all_reduce(PCIE, 16384, 2).how.startswith("NCCL")
    assert c.all_reduce(c.Link.named("NVLink A100"), 16384, 8).how.startswith("NCCL")  # no data
    assert c.all_reduce(NVLINK, 16384, 1).seconds == 0


def test_a_send_is_one_step_without_a_collective_base_latency():
    hop = c.send(IB, 64 * 8192 * 2 * 2)
    assert hop.latency_s in (5.0e-6, 8.5e-6, 14e-6)    # one NET hop (one GPU a server), no base
    assert hop.bytes == 64 * 8192 * 2 * 2
    assert c.send(IB, 1e3).seconds < c.nccl_all_reduce(IB, 1e3, 2).seconds


def test_deepep_bytes_reproduce_its_published_bandwidths():
    """DeepEP's logical bandwidth is (tokens x top-k messages) / time, with (hidden + hidden /
    128 x 4 + 16) bytes a dispatch message and hidden x 2 a combine row (its test masks a few
    routed copies at random, and rounds: within 3%)."""
    a2a = c.ExpertAllToAll(144, 8, 7168, NIC, layers=58)
    assert a2a.bytes_per_token("dispatch") == 8 * (7168 + 224 + 16) == 59264
    assert a2a.bytes_per_token("combine") == 8 * 7168 * 2
    for row in (r for k in c.DEEPEP_KERNELS for r in c.deepep_rows(k)):
        x = c.ExpertAllToAll(int(row["ep"]), int(row["topk"]), int(row["hidden"]), NIC)
        for phase in ("dispatch", "combine"):
            logical = row["tokens"] * x.bytes_per_token(phase) / (row[f"{phase}_us"] * 1e-6)
            assert logical == pytest.approx(row[f"{phase}_gbs"] * 1e9, rel=0.03), (row, phase)


def test_the_nic_share_follows_the_kernel_version():
    assert c.ExpertAllToAll(144, 8, 7168, NIC).remote_share == pytest.approx(143 / 144)
    assert c.ExpertAllToAll(144, 8, 7168, NIC, kernel="nvlink").remote_share == pytest.approx(136 / 144)
    assert c.ExpertAllToAll(8, 8, 7168, NIC, kernel="nvlink").remote_share == 0   # all NVLink
    assert {r["kernel"] for r in c.deepep_rows()} == {"rdma", "nvlink", "normal"}
    assert {r["ep"] for r in c.deepep_rows("nvlink")} == {8, 16, 32, 64}   # re-measured only


def test_the_pure_rdma_table_implies_one_nic_bandwidth_and_no_visible_fixed_cost():
    achieved = []
    for row in c.deepep_rows("rdma"):
        x = c.ExpertAllToAll(int(row["ep"]), 8, 7168, NIC)
        for phase in ("dispatch", "combine"):
            bw = row["tokens"] * x.nic_bytes_per_token(phase) / (row[f"{phase}_us"] * 1e-6)
            achieved.append(bw)
            # what the line rate leaves over scales with the bytes, as a slower NIC's would
        rest = {p: row[f"{p}_us"] * 1e-6 - row["tokens"] * x.nic_bytes_per_token(p) / 50e9
                for p in ("dispatch", "combine")}
        assert rest["combine"] / rest["dispatch"] == pytest.approx(
            x.row_bytes("combine") / x.row_bytes("dispatch"), rel=0.25)
    assert 38e9 < min(achieved) and max(achieved) < 42.5e9   # ~39-42 GB/s at every width


def test_both_bounds_reproduce_the_published_times_and_part_away_from_them():
    for row in c.deepep_rows("rdma"):
        for fixed in (False, True):
            x = c.ExpertAllToAll(int(row["ep"]), 8, 7168, NIC, fixed_latency=fixed)
            for phase in ("dispatch", "combine"):
                assert x.cost(phase, row["tokens"]).seconds == pytest.approx(
                    row[f"{phase}_us"] * 1e-6)
    low = c.ExpertAllToAll(144, 8, 7168, NIC)
    high = c.ExpertAllToAll(144, 8, 7168, NIC, fixed_latency=True)
    for phase in ("dispatch", "combine"):
        assert low.latency_s(phase) == 0 and low.cost(phase, 0).seconds == 0
        assert 30e-6 < high.latency_s(phase) < 90e-6       # the remainder at EP 128-256
        # below DeepEP's 128 tokens the fixed cost makes the call dearer, above it cheaper
        assert high.cost(phase, 44).seconds > low.cost(phase, 44).seconds
        assert high.cost(phase, 512).seconds < low.cost(phase, 512).seconds
    with pytest.raises(ValueError, match="EP"):
        c.ExpertAllToAll(512, 8, 7168, NIC).cost("dispatch", 1)
    with pytest.raises(ValueError, match="kernel"):
        c.ExpertAllToAll(144, 8, 7168, NIC, kernel="v2")


def test_prefill_kernels_send_a_token_once_per_node_at_their_published_bandwidth():
    """DeepEP's normal kernels (training and prefill): one FP8 row per destination node, at
    most 4 nodes under node-limited routing, at the bottleneck bandwidth of its table."""
    ep32 = c.PrefillAllToAll(32, 8, 7168)
    assert ep32.destinations_per_token() == pytest.approx(4 * (1 - 0.75 ** 8))
    assert c.PrefillAllToAll(256, 8, 7168).destinations_per_token() == pytest.approx(
        ep32.destinations_per_token())                      # still at most 4 nodes
    assert ep32.row_bytes("dispatch") == 7168 * (1 + 4 / 128) and ep32.row_bytes("combine") == 14336
    assert ep32.bandwidth("dispatch") == 58e9 and ep32.bandwidth("combine") == 57e9
    assert c.PrefillAllToAll(8, 8, 7168).bandwidth("combine") == 158e9     # NVLink, one node
    assert c.PrefillAllToAll(48, 8, 7168).bandwidth("dispatch") == pytest.approx(54.5e9)
    call = ep32.cost("dispatch", 4096)
    assert call.latency_s == 0 and call.bytes == pytest.approx(4096 * 3.5995 * 7392, rel=1e-4)
    assert call.seconds == pytest.approx(call.bytes / 58e9)
    # per token, prefill's kernels move fewer bytes over the NIC than decode's, and faster
    decode = c.ExpertAllToAll(144, 8, 7168, NIC)
    assert ep32.bytes_per_token("dispatch") < decode.nic_bytes_per_token("dispatch") / 2
    assert ep32.bandwidth("dispatch") > decode.nic_bandwidth("dispatch")
    with pytest.raises(ValueError, match="EP"):
        c.PrefillAllToAll(12, 8, 7168).cost("dispatch", 1)
