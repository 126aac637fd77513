"""The online engine: requests submitted while it runs stream the tokens offline serve gives;
an abort frees its blocks; temperature sampling is seeded; shutdown drains."""

import asyncio
import threading

import pytest
import torch

from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import serve
from inferlab.serving.online import EngineClosedError, OnlineEngine
from inferlab.serving.request import Request
from inferlab.validation import InvalidRequestError

from conftest import tiny_model

CONFIG = ServingConfig(num_blocks=64, max_batch=8)


def model():
    return tiny_model(128, dtype="float32")


def requests(n, seed=0, max_new=12):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, 40, (n,), generator=g).tolist()
    return [Request(tuple(torch.randint(1, 500, (k,), generator=g).tolist()), max_new,
                    eos_token_ids=(7,)) for k in lens]


@pytest.fixture
def engine():
    eng = OnlineEngine(model(), CONFIG)
    yield eng
    eng.shutdown(drain=False)
    assert not eng._thread.is_alive()


def test_streams_equal_offline_serve_while_requests_keep_arriving(engine):
    reqs = requests(16)
    offline = serve(model(), reqs, CONFIG)
    streams = []
    for i, r in enumerate(reqs):  # submitted a few at a time while the loop runs
        streams.append(engine.submit(r))
        if i % 6 == 5:
            streams[-1].result()
    for s, res in zip(streams, offline.results):
        assert s.result() == list(res.tokens)
        assert s.finished.reason == res.finish_reason
        assert len(s.finished.timing.token_times_s) == len(res.tokens)
    assert engine.blocks_in_use == 0 and engine.idle()


def test_a_static_batch_ends_each_stream_when_done_and_frees_its_blocks_at_the_end():
    config = ServingConfig(num_blocks=64, max_batch=4, policy="static")
    reqs = [Request(r.prompt, n) for r, n in zip(requests(3, seed=2), (2, 9, 5))]
    offline = serve(model(), reqs, config)
    eng = OnlineEngine(model(), config)
    try:
        streams = [eng.submit(r) for r in reqs]
        for s, res in zip(streams, offline.results):
            assert s.result() == list(res.tokens)  # a padding member streams nothing more
        assert eng.wait_idle() and eng.blocks_in_use == 0  # the batch ended, and freed them
    finally:
        eng.shutdown(drain=False)


def test_abort_frees_blocks_at_once_and_others_continue(engine):
    long, other = requests(2, seed=1, max_new=80)
    a, b = engine.submit(long), engine.submit(other)
    it = iter(a)
    next(it), next(it)
    engine.abort(a)
    list(it)  # the tokens of steps that ran before the abort was seen, then the end
    assert len(a.tokens) < 80
    assert a.finished.reason == "abort"
    assert b.result() == list(serve(model(), [other], CONFIG).results[0].tokens)
    assert engine.blocks_in_use == 0


def test_abort_of_a_request_still_waiting(engine):
    reqs = requests(12, seed=2, max_new=30)
    streams = [engine.submit(r) for r in reqs]
    engine.abort(streams[-1])  # max_batch is 8: the last cannot be running yet
    for s in streams:
        s.result()
    assert streams[-1].finished.reason == "abort" and streams[-1].tokens == []
    assert engine.blocks_in_use == 0


def test_async_streams(engine):
    reqs = requests(6, seed=3)

    async def main():
        loop = asyncio.get_running_loop()

        async def one(r):
            return [t async for t in engine.submit(r, loop=loop)]
        return await asyncio.gather(*(one(r) for r in reqs))

    got = asyncio.run(main())
    assert got == [list(r.tokens) for r in serve(model(), reqs, CONFIG).results]


def test_temperature_sampling_is_seeded_and_differs_from_greedy(engine):
    r = requests(1, seed=4, max_new=20)[0]
    hot = Request(r.prompt, 20, temperature=1.5, seed=11)
    first, second = engine.submit(hot).result(), engine.submit(hot).result()
    assert first == second
    assert first != engine.submit(r).result()
    with pytest.raises(InvalidRequestError, match="temperature"):
        engine.submit(Request(r.prompt, 4, temperature=-1.0))


def test_invalid_requests_are_refused_on_submit(engine):
    with pytest.raises(InvalidRequestError, match="context"):
        engine.submit(Request(tuple(range(1, 200)), 4))


def test_shutdown_drains_then_refuses():
    eng = OnlineEngine(model(), CONFIG)
    streams = [eng.submit(r) for r in requests(6, seed=5)]
    eng.shutdown(drain=True)
    assert all(s.result() and s.finished.reason in ("stop", "length") for s in streams)
    with pytest.raises(EngineClosedError):
        eng.submit(requests(1)[0])
    assert not eng._thread.is_alive()
    assert "inferlab-engine" not in [t.name for t in threading.enumerate()]


def test_a_crashed_loop_ends_every_stream_and_says_so():
    """A failure inside a step ends only its requests (tests/test_engine_faults.py); one in the
    loop's own bookkeeping, outside every step, stops the loop, and then no stream hangs."""
    eng = OnlineEngine(model(), CONFIG)

    def boom(*args):
        raise RuntimeError("the device fell over")
    eng.engine.step = boom
    stream = eng.submit(requests(1)[0])
    assert stream.result() == [] and stream.finished.reason == "error"
    eng._thread.join(5)
    assert not eng.alive and isinstance(eng.error, RuntimeError)
    with pytest.raises(EngineClosedError):
        eng.submit(requests(1)[0])


def test_a_prefill_token_streams_before_the_step_s_decode_batch(engine):
    """A newcomer's first token leaves when its prefill ends, not after the decode batch that
    runs later in the same step: while that batch is held back, the token is already there."""
    first, second = requests(2, seed=5, max_new=40)
    a = engine.submit(Request(first.prompt, 40))  # no EOS: it keeps decoding
    next(iter(a))  # a is running: from now on every step has a decode batch
    entered, go, holding = threading.Semaphore(0), threading.Semaphore(0), [True]
    real_forward = engine.engine.runner.forward

    def held_decode(rows):
        decoding = not any(r.prefill for r in rows)
        if holding[0] and decoding:  # the decode batch, not a prefill
            entered.release()
            assert go.acquire(timeout=10), "the test never let the decode batch go"
        return real_forward(rows)

    engine.engine.runner.forward = held_decode
    try:
        assert entered.acquire(timeout=10)  # a step is in a's decode batch
        b = engine.submit(second)           # admitted at the next step
        go.release()
        assert entered.acquire(timeout=10)  # the next step ran b's prefill and holds a's decode
        token = b._queue.get(timeout=5)     # yet b's first token is already in its stream
        want = serve(model(), [second], CONFIG).results[0].tokens[0]
        assert token == want
    finally:
        holding[0] = False
        for _ in range(4):
            go.release()
        engine.engine.runner.forward = real_forward
