"""``python -m inferlab.serve``: the course's engine behind an OpenAI-compatible HTTP server.

    python -m inferlab.serve                        # the course's trained model on :8000
    python -m inferlab.serve --model PATH_OR_NAME --port 8001 --api-key k1=alice --api-key \\
        k2=bob --prefix-cache salted --max-in-flight 16

The model is a checkpoint directory, one of the course's own models (``course-target``, the
default: nothing to download) or a Hugging Face id (downloaded; needs a network). ``build``
makes the app without serving it, for a notebook or a test.
"""

from __future__ import annotations

import argparse

from inferlab.serve.tenants import Tenants
from inferlab.serving.block_manager import blocks_for
from inferlab.serving.config import ServingConfig

DEFAULT_MODEL = "course-target"


def build(model: str = DEFAULT_MODEL, served_name: str | None = None, max_batch: int = 32,
          num_blocks: int | None = None, token_budget: int | None = None,
          max_waiting: int = 64, tenants: Tenants | None = None, prefix_cache: bool = False,
          device: str = "cpu"):
    """Load ``model`` and its tokenizer and return the app (``create_app``) over an engine."""
    from inferlab.model.weights import checkpoint_path, load_checkpoint, load_tokenizer
    from inferlab.serve.app import create_app
    from inferlab.serving.online import OnlineEngine

    path = checkpoint_path(model)
    net = load_checkpoint(path, device=device)
    tokenizer = load_tokenizer(path, net)
    if num_blocks is None:  # room for a full batch of full-context sequences
        num_blocks = max_batch * blocks_for(net.config.max_seq_len, 16)
    config = ServingConfig(num_blocks=num_blocks, max_batch=max_batch, token_budget=token_budget,
                           policy="chunked" if token_budget else "continuous")
    engine = OnlineEngine(net, config, prefix_cache=prefix_cache)
    return create_app(engine, tokenizer, served_name or str(model), max_waiting, tenants)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m inferlab.serve", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint directory or name")
    p.add_argument("--served-model-name", default=None, help="the name clients send as model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None,
                   help="torch's intra-op threads on the CPU (default: torch's choice); leave a "
                        "core for the HTTP server and the clients")
    p.add_argument("--max-batch", type=int, default=32, help="sequences running at once")
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks of 16 tokens")
    p.add_argument("--token-budget", type=int, default=None,
                   help="chunked prefill: tokens per step (needed by --prefix-cache)")
    p.add_argument("--max-waiting", type=int, default=64,
                   help="queued requests beyond which the server answers 429")
    p.add_argument("--api-key", action="append", default=[], metavar="KEY=TENANT")
    p.add_argument("--max-in-flight", type=int, default=None, help="requests per tenant")
    p.add_argument("--prefix-cache", choices=["off", "shared", "salted"], default="off")
    a = p.parse_args(argv)
    if a.threads is not None:
        import torch

        torch.set_num_threads(a.threads)
    tenants = Tenants.parse(a.api_key, max_in_flight=a.max_in_flight,
                            salted=a.prefix_cache == "salted")
    budget = a.token_budget or (max(256, a.max_batch) if a.prefix_cache != "off" else None)
    app = build(a.model, a.served_model_name, a.max_batch, a.num_blocks, budget,
                a.max_waiting, tenants, a.prefix_cache != "off", a.device)
    uvicorn.run(app, host=a.host, port=a.port, timeout_graceful_shutdown=30)


if __name__ == "__main__":
    main()
