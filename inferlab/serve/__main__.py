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
from inferlab.serving.config import BLOCK_SIZE, ServingConfig

DEFAULT_MODEL = "course-target"


# Defaults shared by ``build`` and the command line, so that the two cannot drift.
MAX_BATCH = 32
MAX_WAITING = 64
STATS_INTERVAL_S = 10.0


def build(model: str = DEFAULT_MODEL, served_name: str | None = None, max_batch: int = MAX_BATCH,
          num_blocks: int | None = None, token_budget: int | None = None,
          max_waiting: int = MAX_WAITING, tenants: Tenants | None = None,
          prefix_cache: bool = False, device: str = "cpu",
          stats_interval_s: float = STATS_INTERVAL_S, kv_tier_blocks: int | None = None,
          shared_prefix_attention: bool = False):
    """Load ``model`` and its tokenizer and return the app (``create_app``) over an engine."""
    from inferlab.model.weights import checkpoint_path, load_checkpoint, load_tokenizer
    from inferlab.serve.app import create_app
    from inferlab.serving.paged_cache import pool_blocks_for
    from inferlab.serving.online import OnlineEngine

    path = checkpoint_path(model)
    net = load_checkpoint(path, device=device)
    tokenizer = load_tokenizer(path, net)
    config = ServingConfig(num_blocks=num_blocks, max_batch=max_batch, token_budget=token_budget,
                           kv_tier_blocks=kv_tier_blocks,
                           shared_prefix_attention=shared_prefix_attention)
    if num_blocks is None:  # the engine's rule, for a full batch of full-context sequences
        config = config.replace(num_blocks=pool_blocks_for(net, net.config.max_seq_len, config))
    engine = OnlineEngine(net, config, prefix_cache=prefix_cache)
    return create_app(engine, tokenizer, served_name or str(model), max_waiting, tenants,
                      stats_interval_s=stats_interval_s)


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Appends each flag's default to its help, unless the help already says what it is."""

    def _get_help_string(self, action):
        return action.help if "default" in (action.help or "") else super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    """The command line: every flag with its help and its default (``--help``)."""
    p = argparse.ArgumentParser(prog="python -m inferlab.serve", description=__doc__.split("\n")[0],
                                formatter_class=_Help)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="checkpoint directory, a course model's name, or a Hugging Face id")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients send as model (default: the --model argument)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--device", default="cpu", help="torch device to run the model on")
    p.add_argument("--threads", type=int, default=None,
                   help="torch's intra-op threads on the CPU (default: torch's choice); leave a "
                        "core for the HTTP server and the clients")
    p.add_argument("--max-batch", type=int, default=MAX_BATCH,
                   help="sequences running at once (vLLM's --max-num-seqs)")
    p.add_argument("--num-blocks", type=int, default=None,
                   help=f"KV blocks of {BLOCK_SIZE} tokens (default: a full batch of "
                        "full-context sequences)")
    p.add_argument("--token-budget", type=int, default=None,
                   help="chunked prefill: tokens per step (needed by --prefix-cache; default "
                        "there: max(256, --max-batch))")
    p.add_argument("--max-waiting", type=int, default=MAX_WAITING,
                   help="queued requests beyond which the server answers 429")
    p.add_argument("--api-key", action="append", default=[], metavar="KEY=TENANT",
                   help="accept this API key as this tenant (repeat for more; default: none, "
                        "the server is open to all as one tenant)")
    p.add_argument("--max-in-flight", type=int, default=None,
                   help="requests one tenant may have in flight (default: no limit)")
    p.add_argument("--prefix-cache", choices=["off", "shared", "salted"], default="off",
                   help="reuse the KV blocks of a common prompt start: across tenants "
                        "(shared) or within each tenant only (salted)")
    p.add_argument("--kv-tier-blocks", type=int, default=None,
                   help="keep up to this many prefix blocks the pool evicts in a second tier "
                        "(host memory under a GPU, a file under a CPU run) and reload them on a "
                        "hit; needs --prefix-cache (default: no tier)")
    p.add_argument("--shared-prefix-attention", action="store_true",
                   help="decode rows that share cached prefix blocks attend to them once "
                        "(cascade attention); needs --prefix-cache")
    p.add_argument("--stats-interval", type=float, default=STATS_INTERVAL_S,
                   help="seconds between the log's serving-stats lines (0: none)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="the server's and uvicorn's log level (info shows the banner, the "
                        "stats and the access log)")
    return p


def main(argv: list[str] | None = None) -> None:
    import logging

    import uvicorn

    a = parser().parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(levelname)s:     %(message)s")
    if a.threads is not None:
        import torch

        torch.set_num_threads(a.threads)
    tenants = Tenants.parse(a.api_key, max_in_flight=a.max_in_flight,
                            salted=a.prefix_cache == "salted")
    budget = a.token_budget or (max(256, a.max_batch) if a.prefix_cache != "off" else None)
    app = build(a.model, a.served_model_name, a.max_batch, a.num_blocks, budget,
                a.max_waiting, tenants, a.prefix_cache != "off", a.device, a.stats_interval,
                a.kv_tier_blocks, a.shared_prefix_attention)
    uvicorn.run(app, host=a.host, port=a.port, timeout_graceful_shutdown=30,
                log_level=a.log_level)


if __name__ == "__main__":
    main()
