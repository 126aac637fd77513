"""The serving engine's entry point: tokens and timings per request; invalid requests refused."""

import time
from functools import lru_cache

import pytest
import torch

from inferlab.model.generate import generate
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine, serve
from inferlab.serving.request import InvalidRequestError, Request, validate_request
from inferlab.model.config import ModelConfig
from inferlab.model.llama import build_model


@lru_cache(maxsize=None)
def model():
    config = ModelConfig.from_name("tiny").scaled(n_layers=2, max_seq_len=64)
    return build_model(config, seed=0).to(torch.float64)


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


def test_timings_and_idle_time_are_skipped_not_slept():
    requests = [Request(prompt(4), 3, 0.0), Request(prompt(4, 1), 3, 50.0)]
    start = time.perf_counter()
    run = serve(model(), requests)
    results = run.results
    assert time.perf_counter() - start < 20, "the engine waited for the late arrival"
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
