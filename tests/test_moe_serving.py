"""The engine and the HTTP server serve a mixture of experts (issue 26, item 6): only the MLP
differs from the dense model, so the paged cache, the scheduler and the runner are unchanged, and
every request's tokens equal generating it alone."""

import shutil

import httpx
import pytest
import torch

from inferlab.model.generate import generate
from inferlab.model.moe import MoELlama, MoEModelConfig, build_moe_model
from inferlab.model.weights import checkpoint_path, load_checkpoint, save_checkpoint
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import serve
from inferlab.serving.request import Request

MOE = MoEModelConfig(n_layers=2, d_model=48, n_heads=4, n_kv_heads=2, ffn_dim=32,
                     vocab_size=1024, max_seq_len=128, n_experts=4, experts_per_token=2,
                     name="serve-moe")


def _requests(n: int = 6) -> list[Request]:
    gen = torch.Generator().manual_seed(0)
    return [Request(prompt=tuple(torch.randint(1, MOE.vocab_size, (3 + 5 * i,), generator=gen)
                                 .tolist()), max_new_tokens=4 + i, arrival_s=0.0, request_id=i)
            for i in range(n)]


@pytest.mark.parametrize("config", [ServingConfig(max_batch=4, num_blocks=64),
                                    ServingConfig(max_batch=4, num_blocks=64, policy="chunked",
                                                  token_budget=16),
                                    ServingConfig(max_batch=4, num_blocks=4)],  # one at a time
                         ids=["continuous", "chunked", "few-blocks"])
def test_served_moe_tokens_equal_generating_each_request_alone(config):
    model = build_moe_model(MOE, seed=3)
    requests = _requests()
    run = serve(model, requests, config)
    for request, result in zip(requests, run.results):
        alone = generate(model, torch.tensor(request.prompt), request.max_new_tokens)
        assert result.ok and list(result.tokens) == alone[0, len(request.prompt):].tolist()


def test_the_http_server_serves_a_mixtral_checkpoint(tmp_path):
    from inferlab.serve.__main__ import build
    from inferlab.serve.background import BackgroundServer

    path = save_checkpoint(build_moe_model(MOE, seed=4), tmp_path / "serve-moe")
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the course tokenizer: 1024 ids
        shutil.copy(checkpoint_path("course-target") / name, path / name)
    model = load_checkpoint(path)
    assert isinstance(model, MoELlama)
    prompt = [5, 17, 300, 41]
    alone = generate(model, torch.tensor(prompt), 6)[0, 4:].tolist()
    with BackgroundServer(build(str(path), served_name="serve-moe", max_batch=2,
                                num_blocks=32, stats_interval_s=0)) as srv:
        r = httpx.post(srv.url + "/v1/completions", timeout=60,
                       json={"model": "serve-moe", "prompt": prompt, "max_tokens": 6,
                             "temperature": 0})
    assert r.status_code == 200, r.text
    from inferlab.model.weights import load_tokenizer
    assert r.json()["choices"][0]["text"] == load_tokenizer(path).decode(alone)
