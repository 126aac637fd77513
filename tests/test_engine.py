"""The serving engine's entry point: tokens and timings per request; invalid requests refused."""

import time

import numpy as np
import pytest
import torch

from inferlab.model.generate import generate
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine, serve
from inferlab.serving.request import Request
from inferlab.validation import InvalidRequestError, validate_request

from conftest import tiny_model


def model():
    return tiny_model(64)


def prompt(n, seed=0):
    return tuple(torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist())


BAD = {
    "empty": (Request((), 4), "prompt is empty"),
    "too long": (Request(prompt(65), 1), "context is 64"),
    "zero new": (Request(prompt(3), 0), "positive integer"),
    "negative new": (Request(prompt(3), -2), "positive integer"),
    "fractional new": (Request(prompt(3), 2.5), "positive integer"),
    "bool new": (Request(prompt(3), True), "positive integer"),
    "past context": (Request(prompt(60), 10), "at most 5"),
    "bad token": (Request((1, 512), 2), "outside"),
    "negative arrival": (Request(prompt(3), 2, -1.0), "arrival_s"),
}


@pytest.mark.parametrize("name", BAD)
def test_invalid_request_is_refused_with_a_clear_error(name):
    request, message = BAD[name]
    with pytest.raises(InvalidRequestError, match=message):
        validate_request(request, model().config)


def test_invalid_requests_do_not_stop_the_others():
    good = [Request(prompt(5, i), 6, 0.001 * i, f"good{i}") for i in range(3)]
    requests = [good[0], BAD["empty"][0], good[1], BAD["too long"][0], BAD["zero new"][0], good[2]]
    results = serve(model(), requests, ServingConfig(max_batch=4)).results
    assert [r.ok for r in results] == [True, False, True, False, False, True]
    assert "request 1 refused: the prompt is empty" in results[1].error
    assert results[1].tokens == () and results[1].timing is None
    for r, q in zip((results[0], results[2], results[5]), good):
        assert r.request_id == q.request_id
        assert list(r.tokens) == generate(model(), torch.tensor(q.prompt), 6)[0, 5:].tolist()


def test_a_request_larger_than_the_whole_cache_is_refused():
    engine = Engine(model(), ServingConfig(num_blocks=2, block_size=4))
    ok, big = Request(prompt(3), 4), Request(prompt(8), 4)
    results = engine.run([ok, big]).results
    assert results[0].ok and "needs 3 KV blocks" in results[1].error


def _no_sleeping(*_):
    raise AssertionError("the offline engine slept instead of moving its clock")


def test_timings_and_idle_time_are_skipped_not_slept(monkeypatch):
    requests = [Request(prompt(4), 3, 0.0), Request(prompt(4, 1), 3, 50.0)]
    monkeypatch.setattr(time, "sleep", _no_sleeping)     # the verdict, not a wall-clock bound
    run = serve(model(), requests)
    results = run.results
    late = results[1].timing
    assert late.token_times_s[0] >= 50.0 and late.ttft < 5
    for r in results:
        times = r.timing.token_times_s
        assert len(times) == 3 and list(times) == sorted(times)
    summary = run.summary()
    assert summary.n_tokens == 6 and summary.duration_s >= 50


def test_static_and_continuous_give_the_same_tokens_and_the_engine_is_reusable():
    requests = [Request(prompt(3 + i, i), 2 + 3 * i, 0.0) for i in range(4)]
    engine = Engine(model(), ServingConfig(num_blocks=40, block_size=4, max_batch=2,
                                           policy="static"))
    run = engine.run(requests)
    first = run.results
    again = engine.run(requests).results
    cont = serve(model(), requests, ServingConfig(policy="continuous", max_batch=2)).results
    assert [r.tokens for r in first] == [r.tokens for r in again] == [r.tokens for r in cont]
    # static: the second batch starts only after the first batch's longest member is done
    first_batch_end = max(r.timing.token_times_s[-1] for r in first[:2])
    assert min(r.timing.token_times_s[0] for r in first[2:]) >= first_batch_end
    padded = [it for it in run.iterations if it.padding_ids]
    assert padded and all(it.decode_batch == 2 for it in padded)


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown policy"):
        Engine(model(), ServingConfig(num_blocks=4, policy="fastest"))


# -- end-of-sequence ---------------------------------------------------------------------------
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_a_request_ends_at_its_end_of_sequence_token(policy, overlap):
    p = prompt(5, 3)
    alone = generate(model(), torch.tensor(p), 12)[0, 5:].tolist()
    eos = alone[3]  # the 4th token it would produce: make it the stop token
    stop_at = alone.index(eos)  # (its first occurrence)
    requests = [Request(p, 12, 0.0, "stops", eos_token_ids=[eos]),
                Request(p, 12, 0.0, "runs on"),
                Request(prompt(4, 9), 7, 0.0, "other")]
    run = serve(model(), requests, ServingConfig(policy=policy, max_batch=3, overlap=overlap))
    stops, runs_on, other = run.results
    assert list(stops.tokens) == alone[:stop_at + 1]  # the stop token is returned, last
    assert stops.finish_reason == "stop" and stops.timing.n_tokens == stop_at + 1
    assert list(runs_on.tokens) == alone and runs_on.finish_reason == "length"
    assert other.finish_reason == "length" and len(other.tokens) == 7
    if policy == "static":  # a request that stopped early holds its row until the batch is done
        assert any(0 in it.padding_ids for it in run.iterations)


def test_invalid_stop_tokens_are_refused():
    with pytest.raises(InvalidRequestError, match="eos_token_ids"):
        validate_request(Request(prompt(3), 2, eos_token_ids=[512]), model().config)


# -- prompts as arrays of any integer type; floats refused clearly --------------------------------
@pytest.mark.parametrize("make", [lambda ids: np.array(ids, dtype=np.int64),
                                  lambda ids: np.array(ids, dtype=np.int32),
                                  lambda ids: np.array(ids, dtype=np.uint16),
                                  lambda ids: torch.tensor(ids, dtype=torch.int16),
                                  lambda ids: list(np.array(ids)),  # NumPy integer scalars
                                  tuple])
def test_prompts_of_any_integer_type_are_accepted(make):
    ids = list(prompt(6, 4))
    request = Request(make(ids), 3)
    validate_request(request, model().config)
    assert request.prompt == tuple(ids) and all(type(t) is int for t in request.prompt)
    (result,) = serve(model(), [request]).results
    assert result.ok and list(result.tokens) == generate(model(), torch.tensor(ids), 3)[0, 6:].tolist()


@pytest.mark.parametrize("bad", [np.array([1.0, 2.0]), torch.tensor([3.0, 4.0]), [1, 2.5],
                                 [1, True], ["a", "b"]])
def test_prompts_that_are_not_integers_are_refused_clearly(bad):
    with pytest.raises(InvalidRequestError, match="token ids are integers"):
        validate_request(Request(bad, 2), model().config)


# -- the pool serve() sizes for itself -----------------------------------------------------------
def test_the_pool_is_sized_from_the_requests_that_can_run():
    huge = Request(prompt(3), 10**12, 0.0, "huge")  # would need terabytes of KV cache
    good = [Request(prompt(5, i), 6, 0.0, f"good{i}") for i in range(3)]
    run = serve(model(), [good[0], huge, *good[1:]], ServingConfig(block_size=4, max_batch=4))
    assert [r.ok for r in run.results] == [True, False, True, True]
    assert "context" in run.results[1].error
    longest = 5 + 6 - 1
    assert run.config.num_blocks == 4 * -(-longest // 4)  # max_batch copies of the longest valid


def test_the_pool_never_exceeds_what_the_device_holds(monkeypatch):
    from inferlab.serving import paged_cache

    block = paged_cache.block_bytes(model(), 4)
    monkeypatch.setattr(paged_cache, "free_memory_bytes", lambda device: 10 * block)
    fits, too_long = Request(prompt(5), 6), Request(prompt(30), 20)  # 3 and 13 blocks of 4
    run = serve(model(), [fits, too_long], ServingConfig(block_size=4, max_batch=8))
    assert run.config.num_blocks == int(10 * block * paged_cache.POOL_MEMORY_FRACTION) // block
    assert run.results[0].ok
    assert not run.results[1].ok and "KV blocks" in run.results[1].error
