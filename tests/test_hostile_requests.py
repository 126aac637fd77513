"""No request can take the engine down (issue 28): one validation at every front door, sampling
that cannot produce NaN, failures isolated per request, seeded sampling that depends on the
request alone, and ``serve`` on a quantized model. The HTTP side is in tests/test_serve_fuzz.py.
"""

from functools import lru_cache

import pytest
import torch

from inferlab.model.config import ModelConfig
from inferlab.model.generate import generate
from inferlab.model.kv_cache import Int8KVCache
from inferlab.model.llama import build_model
from inferlab.model.quant import int8_weight_only
from inferlab.model.sampling import GREEDY_BELOW, sample, truncate
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine, serve
from inferlab.serving.online import OnlineEngine
from inferlab.serving.paged_cache import block_bytes
from inferlab.serving.request import Request, Sequence
from inferlab.validation import SEED_MAX, SEED_MIN, InvalidRequestError, validate_request

from conftest import tiny_model

CONFIG = ServingConfig(num_blocks=64, max_batch=8)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # an engine thread runs beside the test


@lru_cache(maxsize=None)
def tiny():
    """The issue's model: ``tiny`` as it is built, float32."""
    return build_model(ModelConfig.from_name("tiny"), seed=0)


def model():  # float64 and small: batching, chunking and preemption never flip a choice
    return tiny_model(128)


def prompt(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(1, 500, (n,), generator=g).tolist())


def offline(m, request, config=CONFIG):
    return serve(m, [request], config).results[0]


# -- the four reproductions of the issue ----------------------------------------------------------
def test_a_seed_out_of_torch_range_is_refused_alone_everywhere():
    bad, ordinary = Request((4, 5, 6), 4, temperature=0.7, seed=2**64), Request((1, 2, 3), 4)
    eng = OnlineEngine(tiny(), CONFIG)
    try:
        with pytest.raises(InvalidRequestError, match="seed") as refused:
            eng.submit(bad)
        assert refused.value.field == "seed"
        stream = eng.submit(ordinary)
        assert stream.result() == list(offline(tiny(), ordinary).tokens)
        assert eng.alive and eng.wait_idle() and eng.blocks_in_use == 0
    finally:
        eng.shutdown(drain=False)
    run = serve(tiny(), [bad, ordinary], CONFIG)  # offline: that request alone is refused
    assert not run.results[0].ok and "request 0 refused" in run.results[0].error
    assert "seed" in run.results[0].error and run.results[0].tokens == ()
    assert run.results[1].ok and run.results[1].tokens == offline(tiny(), ordinary).tokens


def test_a_temperature_below_the_floor_is_greedy_not_nan():
    cold, greedy = Request((4, 5, 6), 6, temperature=1e-40, seed=3), Request((4, 5, 6), 6)
    want = offline(tiny(), greedy).tokens
    assert offline(tiny(), cold).tokens == want
    eng = OnlineEngine(tiny(), CONFIG)
    try:
        assert eng.submit(cold).result() == list(want)
        assert eng.alive and eng.num_failed == 0
    finally:
        eng.shutdown(drain=False)


def test_seeded_sampling_does_not_depend_on_chunking():
    request = Request(tuple(range(1, 41)), 8, temperature=0.8, seed=7)
    alone = offline(tiny(), request).tokens
    chunked = serve(tiny(), [request], ServingConfig(num_blocks=64, max_batch=8,
                                                     policy="chunked", token_budget=16))
    assert any(c > 0 for it in chunked.iterations for _, _, c, _ in it.prefill_rows)  # it was split
    assert chunked.results[0].tokens == alone


def test_serve_runs_an_int8_quantized_model_with_its_default_pool():
    q = int8_weight_only(build_model(ModelConfig.from_name("tiny").scaled(n_layers=2), seed=0))
    requests = [Request(prompt(9, i), 6) for i in range(3)]
    run = serve(q, requests)  # the pool sized by serve(): block bytes from the cache's dtype
    for request, result in zip(requests, run.results):
        assert result.ok, result.error
        assert list(result.tokens) == generate(q, torch.tensor(request.prompt), 6)[0, 9:].tolist()
    c = q.config
    assert block_bytes(q, 16) == 2 * c.n_layers * 16 * c.n_kv_heads * c.head_dim * 4
    assert block_bytes(q, 16) == \
        Engine(q, ServingConfig(num_blocks=1)).cache.nbytes  # one block: what the pool holds


# Requests whose greedy tokens an int8 KV cache changes (found by trying prompt seeds): they show
# that the engine's int8 pool really rounds, and rounds as Chapter 5's Int8KVCache does.
INT8_SENSITIVE = [Request(prompt(n, seed=s), 24, request_id=s)
                  for s, n in [(8, 10), (9, 15), (11, 25), (14, 5), (36, 10)]]


@lru_cache(maxsize=None)
def alone_int8(request):
    cache = Int8KVCache.for_model(model(), 1, max_len=len(request.prompt) + 23)
    out = generate(model(), torch.tensor(request.prompt), 24, cache=cache)
    return tuple(out[0, len(request.prompt):].tolist())


@pytest.mark.parametrize("config", [
    ServingConfig(num_blocks=64, max_batch=8, kv_cache_dtype="int8"),
    ServingConfig(num_blocks=64, max_batch=8, policy="chunked", token_budget=12,
                  kv_cache_dtype="int8")], ids=["continuous", "chunked"])
def test_serve_with_an_int8_kv_cache_equals_chapter_5s_int8_cache(config):
    engine = Engine(model(), config)
    assert engine.cache.k.dtype == torch.int8
    run = engine.run(INT8_SENSITIVE)
    for request, result in zip(INT8_SENSITIVE, run.results):
        assert result.tokens == alone_int8(request)
        assert result.tokens != alone_tokens(Request(request.prompt, 24))  # it did round
    assert engine.cache.memory.num_free == engine.num_blocks
    if config.chunked:  # prompts continued over cached, int8 blocks
        assert any(c > 0 for it in run.iterations for _, _, c, _ in it.prefill_rows)


def test_an_int8_kv_pool_is_sized_by_its_own_bytes():
    int8, plain = ServingConfig(kv_cache_dtype="int8"), ServingConfig()
    c = model().config
    per_block = block_bytes(model(), 16, int8)
    assert per_block == 2 * c.n_layers * 16 * c.n_kv_heads * (c.head_dim + 4)  # codes + scale
    assert per_block == Engine(model(), int8.replace(num_blocks=1)).cache.nbytes
    assert block_bytes(model(), 16, plain) == \
        2 * c.n_layers * 16 * c.n_kv_heads * c.head_dim * 8  # float64
    run = serve(model(), INT8_SENSITIVE[:2], int8)  # the pool serve() sizes itself
    assert [r.tokens for r in run.results] == [alone_int8(r) for r in INT8_SENSITIVE[:2]]
    eng = OnlineEngine(model(), int8.replace(num_blocks=32))  # and online
    try:
        assert tuple(eng.submit(INT8_SENSITIVE[2]).result()) == alone_int8(INT8_SENSITIVE[2])
    finally:
        eng.shutdown(drain=False)


# -- one validation, every field ------------------------------------------------------------------
BAD_FIELDS = [
    (dict(temperature=2.5), "temperature"), (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(temperature=float("inf")),
                                                      "temperature"),
    (dict(temperature="hot"), "temperature"), (dict(temperature=True), "temperature"),
    (dict(seed=SEED_MAX + 1), "seed"), (dict(seed=SEED_MIN - 1), "seed"), (dict(seed=1.5), "seed"),
    (dict(seed=True), "seed"), (dict(seed="7"), "seed"), (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=2.0), "max_new_tokens"), (dict(arrival_s=float("nan")), "arrival_s"),
    (dict(cache_salt=7), "cache_salt"), (dict(eos_token_ids=(-1,)), "eos_token_ids"),
    (dict(prompt=(1, 10**6)), "prompt"), (dict(top_k=-1), "top_k"), (dict(top_k=2.0), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p"),
]


@pytest.mark.parametrize("change, field", BAD_FIELDS)
def test_every_field_is_checked_and_named(change, field):
    fields = dict(prompt=(1, 2, 3), max_new_tokens=4, temperature=0.5, seed=1) | change
    request = Request(**fields)
    with pytest.raises(InvalidRequestError) as refused:
        validate_request(request, model().config)
    assert refused.value.field == field and field in str(refused.value)
    with pytest.raises(InvalidRequestError) as renamed:  # in the caller's names
        validate_request(request, model().config, names={field: "the_" + field})
    assert renamed.value.field == "the_" + field and "the_" + field in str(renamed.value)


@pytest.mark.parametrize("seed", [SEED_MIN, -1, 0, SEED_MAX])
def test_every_accepted_seed_seeds_a_generator(seed):
    request = Request((1, 2, 3), 3, temperature=1.0, seed=seed)
    validate_request(request, model().config)
    assert Sequence(0, request).generator is not None


def test_sampling_never_gives_nan_for_any_accepted_temperature():
    logits = torch.randn(6, 512, dtype=torch.float64) * 30
    logits[0, 7] = 1e4  # a huge logit: scaled by 1 / 1e-5 it would overflow without the shift
    temps = torch.tensor([0.0, GREEDY_BELOW / 10, GREEDY_BELOW, 0.3, 1.0, 2.0])
    gens = [torch.Generator().manual_seed(i) for i in range(6)]
    tokens = sample(logits, temps, gens)
    greedy = logits.argmax(-1).tolist()
    assert tokens[:3] == greedy[:3]  # below the floor (and at it, here): the argmax
    assert all(0 <= t < 512 for t in tokens)
    again = sample(logits, temps, [torch.Generator().manual_seed(i) for i in range(6)])
    assert again == tokens  # seeded
    cold = torch.Generator().manual_seed(1)  # a greedy row never draws from its generator
    state = cold.get_state()
    assert sample(logits[1:2], temps[1:2], [cold]) == greedy[1:2]
    assert torch.equal(cold.get_state(), state)
    hot = torch.Generator().manual_seed(4)  # a row without a generator does not draw (a chunk)
    assert sample(logits[3:5], temps[3:5], [None, hot])[0] == greedy[3]
    assert not torch.equal(hot.get_state(), state)


def test_a_faulty_row_is_refused_even_beside_sampled_rows():
    logits = torch.randn(3, 64)
    logits[1, 5] = float("nan")
    temps = torch.tensor([1.0, 1.0, 0.0])
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    with pytest.raises(ValueError, match=r"not finite in rows \[1\]"):
        sample(logits, temps, gens)


def test_on_the_cpu_a_sequence_draws_from_its_own_generator():
    seq = Sequence(0, Request((1, 2, 3), 3, temperature=1.0, seed=7))
    runner = Engine(model(), ServingConfig(num_blocks=4)).runner
    assert runner.generator(seq) is seq.generator
    assert runner.generator(Sequence(1, Request((1, 2), 3))) is None


def test_top_k_and_top_p_sample_among_the_likeliest_tokens_only():
    logits = torch.randn(4, 512, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    order = logits.argsort(-1, descending=True)
    probs = torch.softmax(logits / 1.5, -1)
    nucleus = [int(((probs[i, order[i]].cumsum(0) - probs[i, order[i]]) < 0.5).sum())
               for i in range(4)]  # the tokens top_p = 0.5 keeps, likeliest first
    assert 1 <= min(nucleus) and max(nucleus) < 512
    temps, k, p = torch.full((4,), 1.5), torch.tensor([1, 3, 0, 0]), torch.tensor([1, 1, 0.5, 1e-9])
    allowed = [set(order[0, :1].tolist()), set(order[1, :3].tolist()),
               set(order[2, :nucleus[2]].tolist()), set(order[3, :1].tolist())]
    seen = [set() for _ in range(4)]
    for seed in range(200):
        gens = [torch.Generator().manual_seed(seed * 4 + i) for i in range(4)]
        for i, token in enumerate(sample(logits, temps, gens, k, p)):
            assert token in allowed[i], (i, token)
            seen[i].add(token)
    assert seen[1] == allowed[1] and len(seen[2]) > 1  # it does sample within the set
    kept = truncate(probs, torch.tensor([0, 2, 5, 0]), torch.tensor([1.0, 1.0, 0.3, 0.3]))
    assert [int((row > 0).sum()) for row in kept] == \
        [512, 2, min(5, nucleus_at(probs[2], order[2], 0.3, top_k=5)),
         nucleus_at(probs[3], order[3], 0.3)]


def nucleus_at(p, order, top_p, top_k=None):
    """Tokens the nucleus of ``p`` keeps, counted by hand (renormalised over the top k)."""
    sorted_p = p[order][:top_k] if top_k else p[order]
    sorted_p = sorted_p / sorted_p.sum()
    mass, n = 0.0, 0
    for q in sorted_p.tolist():
        if mass >= top_p:
            break
        mass, n = mass + q, n + 1
    return n


# -- seeded sampling is a function of the request alone ------------------------------------------
CONFIGS = {
    "continuous, batch 8": ServingConfig(num_blocks=64, max_batch=8),
    "continuous, batch 2": ServingConfig(num_blocks=64, max_batch=2),
    "continuous, tight pool": ServingConfig(num_blocks=11, block_size=4, max_batch=6),
    "chunked, budget 6": ServingConfig(num_blocks=64, max_batch=6, policy="chunked",
                                       token_budget=6),
    "chunked, budget 16": ServingConfig(num_blocks=64, max_batch=8, policy="chunked",
                                        token_budget=16),
    "chunked, budget 9, tight pool": ServingConfig(num_blocks=11, block_size=4, max_batch=4,
                                                   policy="chunked", token_budget=9),
    "static": ServingConfig(num_blocks=64, max_batch=4, policy="static"),
}


def mixed_requests():
    """Seeded and greedy requests of several lengths, arriving together and a little apart."""
    out = []
    for i in range(6):
        seeded = i % 3 != 2
        out.append(Request(prompt(5 + 5 * i, seed=i), 10, 0.001 * (i // 2), f"r{i}",
                           temperature=0.9 if seeded else 0.0, seed=100 + i if seeded else None,
                           top_k=20 if i == 1 else 0, top_p=0.8 if i in (3, 4) else 1.0))
    return out


@lru_cache(maxsize=None)
def alone_tokens(request):
    return offline(model(), request, ServingConfig(num_blocks=64, max_batch=1)).tokens


@pytest.mark.parametrize("name", CONFIGS)
def test_seeded_tokens_are_those_of_the_request_served_alone(name):
    requests = mixed_requests()
    engine = Engine(model(), CONFIGS[name])
    run = engine.run(requests)
    for request, result in zip(requests, run.results):
        assert result.ok, result.error
        assert result.tokens == alone_tokens(request), (name, request.request_id)
    assert engine.cache.memory.num_free == engine.num_blocks
    if "tight" in name:
        assert run.num_preemptions > 0  # the case it is meant to cover did happen
    if "chunked" in name:
        assert any(c > 0 for it in run.iterations for _, _, c, _ in it.prefill_rows)


def test_seeded_tokens_are_the_same_online():
    requests = mixed_requests()
    eng = OnlineEngine(model(), CONFIGS["chunked, budget 6"])
    try:
        streams = [eng.submit(r) for r in requests]
        assert [tuple(s.result()) for s in streams] == [alone_tokens(r) for r in requests]
    finally:
        eng.shutdown(drain=False)


# -- failures are isolated: injected at each stage, the engine keeps serving ---------------------
CHUNKED = ServingConfig(num_blocks=64, max_batch=8, policy="chunked", token_budget=16)
MARKED = Request(prompt(12, seed=99), 10, request_id="marked")


def is_marked(seq) -> bool:
    return tuple(seq.prompt) == MARKED.prompt


def inject(eng, stage, monkeypatch):
    """Make ``stage`` raise: for the marked request where the stage handles one request, once
    for the whole step where it handles a batch."""
    fired = []

    def once(real):
        def wrapper(*args):
            if not fired:
                fired.append(True)
                raise RuntimeError(f"injected into {stage}")
            return real(*args)
        return wrapper

    def for_marked(real):
        def wrapper(seq, *args):
            if is_marked(seq):
                fired.append(True)
                raise RuntimeError(f"injected into {stage}")
            return real(seq, *args)
        return wrapper

    if stage == "admission":  # handing the request's sequence over to the loop
        eng.engine.submit = for_marked(eng.engine.submit)
    elif stage == "arrival":  # the scheduler taking it into its waiting queue
        eng.scheduler.add = for_marked(eng.scheduler.add)
    elif stage == "scheduling":  # the policy admitting it, halfway through a step
        eng.scheduler.admit = for_marked(eng.scheduler.admit)
    elif stage in ("prefill", "decode batch", "chunked forward"):  # the runner's one forward
        real = eng.engine.runner.forward

        def kind(rows):  # which forward of a step these rows are
            if eng.config.chunked:
                return "chunked forward"
            return "prefill" if any(r.prefill for r in rows) else "decode batch"

        def always(rows):  # every prefill of the marked request fails
            fired.append(True)
            raise RuntimeError(f"injected into {stage}")

        failing = always if stage == "prefill" else once(real)
        eng.engine.runner.forward = lambda rows: (
            failing(rows) if kind(rows) == stage and any(is_marked(r.seq) for r in rows)
            else real(rows))
    elif stage == "sampling":  # the model's logits turn NaN for the marked request's rows
        real = eng.engine.runner.model.forward

        def nan_for_marked(ids, positions, cache, **kw):
            out = real(ids, positions, cache, **kw)
            rows = [i for i, t in enumerate(cache.tables) if t is marked_table(eng)]
            if rows and not fired:
                fired.append(True)
                out = out.clone()
                out[:, rows] = float("nan")  # (1, rows, V): one packed forward
            return out
        eng.engine.runner.model = _Wrapped(eng.engine.runner.model, nan_for_marked)
    return fired


class _Wrapped:
    """A model whose forward is replaced, everything else passed through."""

    def __init__(self, model, forward):
        self._model, self._forward = model, forward

    def __call__(self, *args, **kwargs):
        return self._forward(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


def marked_table(eng):
    for seq in eng.scheduler.running:
        if is_marked(seq):
            return seq.table
    return None


STAGES = [("admission", CONFIG), ("arrival", CONFIG), ("scheduling", CONFIG),
          ("prefill", CONFIG), ("decode batch", CONFIG), ("chunked forward", CHUNKED),
          ("scheduling", CHUNKED), ("sampling", CONFIG)]


@pytest.mark.parametrize("stage, config", STAGES, ids=[f"{s}-{c.policy}" for s, c in STAGES])
def test_a_failure_at_any_stage_ends_its_requests_and_the_engine_serves_on(stage, config,
                                                                           monkeypatch):
    others = [Request(prompt(6 + 3 * i, seed=i), 12, request_id=i) for i in range(5)]
    later = [Request(prompt(8, seed=50 + i), 8, request_id=f"later{i}") for i in range(3)]
    want = {r.request_id: alone_tokens(r) for r in [*others, *later]}
    eng = OnlineEngine(model(), config)
    try:
        fired = inject(eng, stage, monkeypatch)
        streams = [eng.submit(r) for r in others[:2]]
        marked = eng.submit(MARKED)  # among others, in one inbox batch
        streams += [eng.submit(r) for r in others[2:]]
        assert eng.wait_idle(60), "a stream never ended"
        assert fired, "the failure was never injected"
        assert marked.result() is not None and marked.finished.reason == "error"
        assert ("not finite" if stage == "sampling" else "injected") in marked.finished.error
        for r, s in zip([*others[:2], *others[2:]], streams):
            s.result()
            if s.finished.reason == "error":  # blamed with the marked one (one forward pass)
                assert stage in ("decode batch", "chunked forward", "scheduling", "sampling")
            else:
                assert tuple(s.tokens) == want[r.request_id]
        assert eng.blocks_in_use == 0 and not eng.scheduler.running
        assert eng.alive and eng.error is None and eng.num_failed >= 1
        assert [tuple(eng.submit(r).result()) for r in later] == \
            [want[r.request_id] for r in later]
        assert eng.blocks_in_use == 0
    finally:
        eng.shutdown(drain=False)
