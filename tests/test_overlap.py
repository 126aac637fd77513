"""Overlap scheduling (``ServingConfig.overlap``): one step of lookahead changes no token.

Every test serves the same requests with and without overlap and compares what each request
got: greedy and seeded sampling, whole prompts, chunked prefill and static batches, a pool small
enough to preempt, end-of-sequence tokens and max_tokens, aborts between steps, and a failing
forward (``on_failure``). Nothing here looks at a time."""

import pytest
import torch

from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine, OverlapEngine, serve
from inferlab.serving.online import OnlineEngine
from inferlab.serving.overlap import PLACEHOLDER
from inferlab.serving.request import Request, Sequence

from conftest import tiny_model

CONFIGS = {
    "continuous": ServingConfig(num_blocks=64, max_batch=8),
    "chunked": ServingConfig(num_blocks=64, max_batch=8, token_budget=16),
    "static": ServingConfig(num_blocks=64, max_batch=4, policy="static"),
    "preempting": ServingConfig(num_blocks=10, max_batch=8),
    "preempting-chunked": ServingConfig(num_blocks=10, max_batch=8, token_budget=16),
}


@pytest.fixture(scope="module")
def model():
    return tiny_model(128)


def requests(n=8, max_new=16, eos=(), seed=0, spread_s=0.0):
    """Prompts of 3-40 tokens; every third sampled at a temperature with its own seed."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        k = int(torch.randint(3, 40, (1,), generator=g))
        out.append(Request(tuple(torch.randint(1, 500, (k,), generator=g).tolist()),
                           max_new - i % 7, arrival_s=spread_s * i, eos_token_ids=eos,
                           temperature=0.9 if i % 3 == 0 else 0.0, seed=i))
    return out


def eos_that_fires(model, reqs, config):
    """A token the requests produce early on, so that some of them stop at it."""
    tokens = [t for r in serve(model, reqs, config).results for t in r.tokens[2:6]]
    return (max(set(tokens), key=tokens.count),)


def outcome(run):
    return [(r.tokens, r.finish_reason, r.error) for r in run.results]


@pytest.mark.parametrize("name", CONFIGS)
def test_the_same_tokens_with_and_without_overlap(model, name):
    config = CONFIGS[name]
    reqs = requests()
    reqs = requests(eos=eos_that_fires(model, reqs, config), spread_s=0.002)
    plain, ahead = serve(model, reqs, config), serve(model, reqs, config.replace(overlap=True))
    assert outcome(ahead) == outcome(plain)
    reasons = {r.finish_reason for r in plain.results}
    assert reasons == {"stop", "length"}, reasons  # both kinds of ending were exercised
    if name.startswith("preempting"):
        assert plain.num_preemptions and ahead.num_preemptions
    assert all(PLACEHOLDER not in r.tokens for r in ahead.results)
    assert all(len(r.timing.token_times_s) == len(r.tokens) for r in ahead.results)


def test_the_config_makes_an_overlap_engine_that_frees_every_block(model):
    config = CONFIGS["preempting"].replace(overlap=True)
    engine = Engine(model, config)
    assert isinstance(engine, OverlapEngine)
    first = engine.run(requests(6))
    assert outcome(engine.run(requests(6))) == outcome(first)  # reusable; run checks leaks
    assert engine.cache.memory.num_free == engine.num_blocks and engine._worker is None
    with pytest.raises(ValueError, match="overlap"):
        ServingConfig(num_blocks=8, overlap=1)


def test_iterations_log_every_forward_with_its_rows(model):
    config = CONFIGS["chunked"]
    reqs = requests(6)
    logs = {}
    for overlap in (False, True):
        engine = Engine(model, config.replace(overlap=overlap))
        logs[overlap] = engine.run(reqs).iterations
    rows = {k: sorted((r.seq_id, r.new, r.cached) for it in v for r in it.rows)
            for k, v in logs.items()}
    assert rows[True] == rows[False]  # same work, whatever the step boundaries


def online_tokens(model, config, reqs, abort_after=None):
    """Each request's stream through an online engine; with ``abort_after`` (request index:
    tokens), that request is aborted once it has streamed that many."""
    eng = OnlineEngine(model, config)
    try:
        streams = [eng.submit(r) for r in reqs]
        if abort_after is not None:
            (i, n), = abort_after.items()
            it = iter(streams[i])
            for _ in range(n):
                next(it)
            eng.abort(streams[i])
        out = [(s.result(), s.finished.reason) for s in streams]
        assert eng.wait_idle(30) and eng.blocks_in_use == 0
        return out
    finally:
        eng.shutdown(drain=False)


@pytest.mark.parametrize("name", ["continuous", "chunked"])
def test_online_streams_equal_offline_with_overlap(model, name):
    config = CONFIGS[name]
    reqs = requests(6)
    reqs = requests(6, eos=eos_that_fires(model, reqs, config))
    want = [(list(r.tokens), r.finish_reason) for r in serve(model, reqs, config).results]
    assert online_tokens(model, config.replace(overlap=True), reqs) == want


@pytest.mark.parametrize("overlap", [False, True])
def test_an_abort_between_steps_keeps_the_tokens_streamed_and_frees_the_rest(model, overlap):
    config = CONFIGS["continuous"].replace(overlap=overlap)
    reqs = requests(3, max_new=30)
    got = online_tokens(model, config, reqs, abort_after={0: 3})
    alone = [list(r.tokens) for r in serve(model, reqs, CONFIGS["continuous"]).results]
    tokens, reason = got[0]
    assert reason == "abort" and tokens == alone[0][:len(tokens)] and len(tokens) < 30
    assert [t for t, _ in got[1:]] == alone[1:]


def drive(model, config, reqs, marked_prompt):
    """Serve ``reqs`` (all arriving at once) step by step with ``on_failure`` set, building the
    inputs of any forward pass that holds the marked request raising (the same failure with
    and without overlap: without, ``forward`` builds them; with, the host builds them a step
    ahead): each request's tokens, the failed ones, the finished ones, the blocks left free."""
    tokens, failed = {i: [] for i in range(len(reqs))}, []
    eng = Engine(model, config, on_token=lambda seq, t, _: tokens[seq.seq_id].append(t),
                 on_failure=lambda seq, why: failed.append((seq.seq_id, why)))
    real = eng.runner.inputs

    def inputs(rows):
        if any(r.seq.request.prompt == marked_prompt for r in rows):
            raise RuntimeError("injected")
        return real(rows)
    eng.runner.inputs = inputs
    for i, r in enumerate(reqs):
        eng.submit(Sequence(i, r))
    finished = []
    while not eng.done:
        finished += eng.step()
    eng.close()
    return tokens, sorted(failed), sorted(s.seq_id for s in finished), eng.cache.memory.num_free


@pytest.mark.parametrize("name", ["continuous", "chunked"])
def test_a_failing_forward_ends_the_same_requests_with_and_without_overlap(model, name):
    reqs = requests(6, max_new=10)
    plain = drive(model, CONFIGS[name], reqs, reqs[3].prompt)
    ahead = drive(model, CONFIGS[name].replace(overlap=True), reqs, reqs[3].prompt)
    assert ahead == plain
    tokens, failed, finished, free = ahead
    assert 3 in dict(failed) and "injected" in dict(failed)[3] and tokens[3] == []
    assert sorted([*dict(failed), *finished]) == list(range(6))
    assert free == CONFIGS[name].num_blocks


def drive_failing_schedule(model, config, reqs):
    """Serve ``reqs`` step by step with ``on_failure`` set, the policy raising once, at the
    first admission (the first request is blamed, the others still wait and nothing is due to
    arrive): the failed requests, each request's tokens, the blocks left free."""
    failed, fired = [], []
    eng = Engine(model, config, on_failure=lambda seq, why: failed.append(seq.seq_id))
    real = eng.scheduler.admit

    def admit(seq):
        if not fired:
            fired.append(seq.seq_id)
            raise RuntimeError("injected")
        return real(seq)
    eng.scheduler.admit = admit
    for i, r in enumerate(reqs):
        eng.submit(Sequence(i, r))
    finished = []
    while not eng.done:
        finished += eng.step()
    eng.close()
    return failed, {s.seq_id: list(s.output) for s in finished}, eng.cache.memory.num_free


@pytest.mark.parametrize("name", ["continuous", "chunked"])
def test_a_failing_schedule_ends_the_same_requests_with_and_without_overlap(model, name):
    """The lookahead asks the policy again after a failed schedule, as the plain loop does
    (it used to find itself stuck with requests waiting and none due)."""
    reqs = requests(4, max_new=6)
    plain = drive_failing_schedule(model, CONFIGS[name], reqs)
    ahead = drive_failing_schedule(model, CONFIGS[name].replace(overlap=True), reqs)
    assert ahead == plain
    failed, tokens, free = ahead
    assert failed == [0] and sorted(tokens) == [1, 2, 3] and free == CONFIGS[name].num_blocks
