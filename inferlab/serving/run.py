"""What a serving run returns: a ``Result`` per request and the ``Run`` that holds them.

``inferlab.serving.loop.StepLoop.run`` (and so ``serve``) returns a ``Run``: one ``Result`` per
request in the order given (its tokens and timings, or the error that refused it), the
``Iteration`` log (``inferlab.serving.iteration``), the preemptions and the tokens they made the
engine compute again, the configuration, and a ``summary()`` in the metrics of
``inferlab.serving.metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferlab.serving.config import ServingConfig
from inferlab.serving.iteration import Iteration
from inferlab.serving.metrics import SLO, RequestTiming, Summary, summarize
from inferlab.serving.request import Request, Sequence


@dataclass(frozen=True)
class Result:
    """What came back for one request: its tokens and timings, or the error that refused it."""

    request_id: object
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]           # the generated tokens (the prompt not included)
    timing: RequestTiming | None      # None for a refused request
    num_preemptions: int = 0
    error: str | None = None
    finish_reason: str | None = None  # "stop" (end-of-sequence token) or "length"

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Run:
    """A serving run: one ``Result`` per request (in the order given), the iteration log, the
    preemptions and the tokens whose K/V they threw away (computed again: ``recomputed_tokens``),
    and the configuration it ran with (``num_blocks`` filled in). ``split``: a disaggregated
    cluster's run, whose requests decode on other instances than the one that prefilled them."""

    results: list[Result]
    iterations: list[Iteration] = field(default_factory=list)
    num_preemptions: int = 0
    config: ServingConfig | None = None
    recomputed_tokens: int = 0
    split: bool = False

    @property
    def timings(self) -> list[RequestTiming | None]:
        return [r.timing for r in self.results]

    def summary(self, slo: SLO | None = None) -> Summary:
        """Throughput and latency percentiles over the requests that completed."""
        return summarize([r.timing for r in self.results if r.ok], slo)


def results_of(requests: list[Request], refused: dict[int, str],
               finished: list[Sequence]) -> list[Result]:
    """One ``Result`` per request, in the order given: request i's is ``refused[i]``'s error,
    or what its sequence (the finished one whose ``seq_id`` is i) produced and when."""
    done = {seq.seq_id: seq for seq in finished}
    results = []
    for i, r in enumerate(requests):
        rid = i if r.request_id is None else r.request_id
        if i in refused:
            results.append(Result(rid, r.prompt, (), None, 0, refused[i]))
            continue
        seq = done[i]
        results.append(Result(rid, r.prompt, tuple(seq.output),
                              RequestTiming(seq.arrival_s, tuple(seq.token_times)),
                              seq.num_preemptions, finish_reason=seq.finish_reason))
    return results
