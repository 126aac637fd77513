"""Pipeline parallelism (inferlab.parallel.pipeline): GPipe's flushed-batch utilisation, and a
continuously decoding pipeline's (equal stages, or a last stage that also runs the LM head),
checked against a small event simulation of the schedule."""

import heapq

import pytest

from inferlab.analysis import collectives
from inferlab.parallel import pipeline as pp


def simulate(batches: int, stages: int, stage_s, transfer_s: float, rounds: int):
    """Run ``batches`` batches round and round through ``stages`` FIFO stages (each batch's
    next step starts when its last one left the last stage) and return each stage's busy
    share over the middle half of the run (no start-up, no final drain), and the mean gap
    between two of a batch's steps. ``stage_s``: one time for every stage, or one per stage."""
    times = [stage_s] * stages if isinstance(stage_s, (int, float)) else list(stage_s)
    free = [0.0] * stages                     # when each stage is next free
    ready = [(0.0, b) for b in range(batches)]  # (time the batch can enter stage 0, batch)
    heapq.heapify(ready)
    busy, done = [[] for _ in range(stages)], {b: [] for b in range(batches)}
    for _ in range(rounds * batches):
        t, b = heapq.heappop(ready)
        for s in range(stages):
            start = max(t, free[s])
            free[s] = start + times[s]
            busy[s].append((start, free[s]))
            t = free[s] + transfer_s          # the hop to the next stage (or back to stage 0)
        done[b].append(t)
        heapq.heappush(ready, (t, b))
    lo, hi = 0.25 * max(free), 0.75 * max(free)
    shares = [sum(max(0.0, min(e, hi) - max(a, lo)) for a, e in spans) / (hi - lo)
              for spans in busy]
    gaps = [(ts[-1] - ts[len(ts) // 2]) / (len(ts) - 1 - len(ts) // 2) for ts in done.values()]
    return shares, sum(gaps) / len(gaps)


def test_gpipe_is_the_flushed_batch_formula():
    assert pp.gpipe_utilisation(1, 4) == 0.25
    assert pp.gpipe_utilisation(8, 4) == 8 / 11
    with pytest.raises(ValueError):
        pp.gpipe_utilisation(0, 4)


@pytest.mark.parametrize("batches,stages,t,tau", [(1, 4, 1.0, 0.0), (2, 4, 1.0, 0.0),
                                                    (4, 4, 1.0, 0.0), (6, 4, 1.0, 0.0),
                                                    (4, 4, 1.0, 0.5), (6, 4, 1.0, 0.5),
                                                    (3, 2, 2.0, 1.0)])
def test_a_decoding_pipeline_never_drains(batches, stages, t, tau):
    shares, gap = simulate(batches, stages, t, tau, rounds=60)
    assert min(shares) == pytest.approx(pp.decode_utilisation(batches, stages, t, tau), abs=0.02)
    if batches <= pp.batches_to_fill(stages, t, tau):
        assert gap == pytest.approx(pp.decode_round_trip_s(stages, t, tau), rel=0.02)
    # GPipe's formula is not this regime's: P batches fill a pipeline with free hops
    if tau == 0 and batches == stages:
        assert min(shares) == pytest.approx(1.0, abs=0.02)
        assert pp.gpipe_utilisation(batches, stages) < 0.6


def test_filling_the_pipeline_takes_p_batches_plus_the_hops():
    assert pp.batches_to_fill(4, 1.0) == 4
    assert pp.batches_to_fill(4, 1.0, 0.5) == 6
    assert pp.decode_utilisation(pp.batches_to_fill(8, 3e-3, 1e-3), 8, 3e-3, 1e-3) == 1.0
    assert pp.decode_utilisation(pp.batches_to_fill(8, 3e-3, 1e-3) - 1, 8, 3e-3, 1e-3) < 1.0


@pytest.mark.parametrize("batches,times,tau", [(4, (1.0, 1.0, 1.0, 1.5), 0.0),
                                                 (6, (1.0, 1.0, 1.0, 1.5), 0.2),
                                                 (3, (2.0, 3.0), 0.5)])
def test_the_slowest_stage_sets_the_pace(batches, times, tau):
    shares, gap = simulate(batches, len(times), times, tau, rounds=60)
    slowest = times.index(max(times))
    assert shares[slowest] == pytest.approx(
        pp.decode_utilisation(batches, len(times), times, tau), abs=0.02)
    # every stage, not only the slowest: a faster one idles while the slowest is full
    each = pp.stage_utilisations(batches, len(times), times, tau)
    assert list(shares) == pytest.approx(each, abs=0.02)
    assert max(each) == each[slowest] and all(u < 1 for i, u in enumerate(each) if i != slowest)
    if batches <= pp.batches_to_fill(len(times), times, tau):
        assert gap == pytest.approx(pp.decode_round_trip_s(len(times), times, tau), rel=0.02)
    # full, the pipeline serves one batch every t_max: slower than equal stages of the same total
    mean = sum(times) / len(times)
    assert 1 / max(times) < 1 / mean


def test_the_last_stage_carries_the_lm_head_and_a_hop_two_vectors():
    from inferlab.analysis.step_time import Shape, StepModel
    from inferlab.model.config import ModelConfig

    config = ModelConfig.from_name("llama-3-70b")
    model = StepModel.for_device(config, "H100 SXM")
    shape = Shape.decode(64, 64 * 1024)
    times = pp.decode_stage_s(model, shape, 4)
    k = {x.name: x.seconds for x in model.kernels(shape)}
    assert sum(times) == pytest.approx(model.seconds(shape))      # every kernel priced once
    assert times[-1] - times[0] == pytest.approx(k["lm_head"])
    assert pp.hop_bytes(64, 8192) == 2 * 64 * 8192 * 2            # hidden states and residual


def test_a_hop_is_one_step_of_nccls_model():
    ib = collectives.Link.named("InfiniBand NDR")
    nbytes = pp.hop_bytes(64, 8192)
    hop = collectives.send(ib, nbytes)
    model = collectives.nccl_model()
    # one network step (one GPU a server: the tree's NET latency), no collective base latency
    both = [model[("tree", p)]["step"]["network"] + nbytes / (
        ib.bus * model[("ring", p)]["share"][1]
        if p != "LL" else min(ib.bus * 0.5, model[("ring", "LL")]["cap"][1]))
        for p in collectives.PROTOCOLS]
    assert hop.seconds == pytest.approx(min(both))
