"""A prefix-cache timing side channel: one tenant learns whether another sent a prompt.

With a prefix cache shared by every tenant, a prompt whose start someone sent recently is
served faster: its cached blocks skip the prefill, so its time to first token (TTFT) drops. An
attacker who can guess a candidate prompt (a document, a template with a secret filled in)
sends it and times the answer: fast means someone else sent that prefix. The attack needs no
access to anyone's data, only a stopwatch. Salting the cache per tenant (vLLM's
``cache_salt``; ``inferlab.serve.tenants``) gives each tenant a namespace of its own, and the
attacker's guess is then right half the time: chance.

``run_attack`` plays both parts against a server: in each trial a fresh secret prefix is sent
by the victim with probability 1/2, then probed by the attacker, who guesses "sent" when the
probe's TTFT is below a threshold calibrated on its own cache hits and misses (which it can
always produce, salted or not). ``shared_prefix_cost`` measures what isolation costs honest
tenants who share a system prompt: with salting each of them computes it once.
"""

from __future__ import annotations

import statistics
import time

import httpx
import numpy as np


def probe(client: httpx.Client, model: str, prompt: list[int], key: str | None) -> float:
    """Seconds until the one-token answer to ``prompt`` arrived (its TTFT, as a client sees it)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    t0 = time.perf_counter()
    r = client.post("/v1/completions", headers=headers, json={
        "model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    return elapsed


def threshold(hit_s: list[float], miss_s: list[float]) -> float:
    """The TTFT below which a probe counts as a cache hit: midway between the medians."""
    return (statistics.median(hit_s) + statistics.median(miss_s)) / 2


def _ids(rng, n: int, vocab: int) -> list[int]:
    return [int(t) for t in rng.integers(1, vocab, n)]


def run_attack(url: str, model: str, victim_key: str | None, attacker_key: str | None,
               trials: int = 20, secret_len: int = 384, calibration: int = 5,
               vocab_size: int = 1000, seed: int = 0) -> dict:
    """The attack's accuracy over ``trials`` secrets, half of them sent by the victim."""
    rng = np.random.default_rng(seed)
    with httpx.Client(base_url=url, timeout=60) as c:
        hits, misses = [], []
        for _ in range(calibration):  # the attacker's own cold and warm probes
            own = _ids(rng, secret_len, vocab_size)
            misses.append(probe(c, model, own + _ids(rng, 4, vocab_size), attacker_key))
            hits.append(probe(c, model, own + _ids(rng, 4, vocab_size), attacker_key))
        cut = threshold(hits, misses)
        sent = [bool(x) for x in rng.random(trials) < 0.5]
        ttfts, guesses = [], []
        for was_sent in sent:
            secret = _ids(rng, secret_len, vocab_size)
            if was_sent:
                probe(c, model, secret + _ids(rng, 8, vocab_size), victim_key)
            t = probe(c, model, secret + _ids(rng, 8, vocab_size), attacker_key)
            ttfts.append(t)
            guesses.append(bool(t < cut))
    correct = sum(g == s for g, s in zip(guesses, sent))  # plain Python numbers, for JSON
    return {"accuracy": correct / trials, "trials": trials, "threshold_s": cut,
            "hit_median_s": statistics.median(hits), "miss_median_s": statistics.median(misses),
            "ttft_s": ttfts, "sent": sent, "guessed": guesses}


def shared_prefix_cost(url: str, model: str, keys: list[str | None], rounds: int = 3,
                       prefix_len: int = 384, vocab_size: int = 1000, seed: int = 1) -> dict:
    """Each tenant of ``keys`` sends ``rounds`` requests that start with one common system
    prompt; the mean TTFT and the total time, which salting raises by one prefill per tenant."""
    rng = np.random.default_rng(seed)
    system = _ids(rng, prefix_len, vocab_size)
    times = []
    with httpx.Client(base_url=url, timeout=60) as c:
        t0 = time.perf_counter()
        for _ in range(rounds):
            for key in keys:
                times.append(probe(c, model, system + _ids(rng, 16, vocab_size), key))
        total = time.perf_counter() - t0
    return {"mean_ttft_s": statistics.mean(times), "total_s": total, "requests": len(times)}


def parser():
    """The command line of ``python -m inferlab.loadgen.side_channel``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m inferlab.loadgen.side_channel",
                                description="Run Lab 9's prefix-cache timing attack against a "
                                "server: can one tenant tell whether another sent a prompt?")
    p.add_argument("--url", default="http://127.0.0.1:8000",
                   help="the server's base URL (default %(default)s)")
    p.add_argument("--model", default=None,
                   help="the model to ask for (default: the first one the server lists)")
    p.add_argument("--victim-key", required=True,
                   help="the API key of the tenant who sends the secrets (required, no default)")
    p.add_argument("--attacker-key", required=True,
                   help="the API key of the tenant who probes (required, no default)")
    p.add_argument("--trials", type=int, default=40,
                   help="secrets, half of them sent by the victim (default %(default)s)")
    p.add_argument("--secret-len", type=int, default=384,
                   help="tokens in each secret prefix (default %(default)s)")
    p.add_argument("--calibration", type=int, default=5,
                   help="the attacker's own probe pairs (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts (default %(default)s)")
    p.add_argument("--cost", action="store_true",
                   help="also time two tenants sharing a system prompt (default: off)")
    p.add_argument("--out", default=None,
                   help="write the result as JSON here (default: not written)")
    return p


def main(argv: list[str] | None = None) -> dict:
    """``python -m inferlab.loadgen.side_channel``: run the attack against a server.

        python -m inferlab.serve --port 8001 --prefix-cache shared --api-key kv=victim \\
            --api-key ka=attacker
        python -m inferlab.loadgen.side_channel --url http://127.0.0.1:8001 \\
            --victim-key kv --attacker-key ka --trials 40

    Prints the attack's accuracy, the attacker's calibration and, with ``--cost``, what two
    tenants who share a system prompt pay on that server (mean TTFT and requests per second).
    """
    import json

    from inferlab.loadgen.client import served_model

    p = parser()
    a = p.parse_args(argv)
    model = a.model or served_model(a.url, a.attacker_key)
    r = run_attack(a.url, model, a.victim_key, a.attacker_key, a.trials, a.secret_len,
                   a.calibration, seed=a.seed)
    print(f"{model} at {a.url}: the attacker guessed right {r['accuracy']:.1%} of {r['trials']} "
          f"trials (chance: 50%); its own cache hits {r['hit_median_s'] * 1e3:.1f} ms, misses "
          f"{r['miss_median_s'] * 1e3:.1f} ms, threshold {r['threshold_s'] * 1e3:.1f} ms")
    if a.cost:
        cost = shared_prefix_cost(a.url, model, [a.victim_key, a.attacker_key],
                                  prefix_len=a.secret_len, seed=a.seed + 1)
        r["shared_prefix_cost"] = cost
        print(f"two tenants sharing a {a.secret_len}-token system prompt: mean TTFT "
              f"{cost['mean_ttft_s'] * 1e3:.1f} ms, {cost['requests'] / cost['total_s']:.1f} "
              "requests/s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"url": a.url, "model": model, **r}, f, indent=2)
    return r


if __name__ == "__main__":
    main()
