"""Who pays for a mixed step: two ways to split a chunked step's time between input and output.

With chunked prefill (Chapter 7) one forward carries decode rows and prompt chunks together. The
device's time in such a step is one number; how much of it an input token and how much an output
token should pay is not a fact of physics but a **convention**, and a cost table that prices the
two kinds of token apart rests on one. This module computes two, from the same steps:

- **by tokens** (``tokens``): each forward's seconds in proportion to the tokens each phase put
  through it (a decode row is one token, a chunk its new tokens). It is what the steady-state
  window records (``Forward.prefill_share``). A decode row in a long compute-bound step then
  pays one token's share, which is about its own arithmetic: the weight read the step needed
  anyway is charged to the prompt.
- **by kernel time** (``kernels``): each kernel class of the forward (``StepModel.kernels``:
  linear layers, attention, LM head, collectives) is split in proportion to what the prompt
  rows alone and the decode rows alone would have cost on that kernel's roofline. Attention and
  the LM head then go to the rows that ran them, and the linear layers' time is shared between
  "the chunk's arithmetic" and "the decode rows' weight read", the larger of which sets the
  kernel's time.

Neither is more correct. What no convention changes is the total: the busy seconds, the tokens
served, the cost of a request or of a blended token. ``split_run`` also counts what the window's
steps did (tokens, rows, steps, bytes and seconds per kernel class), so that a conclusion drawn
from a cost can be checked against the work behind it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from inferlab.analysis.step_time import Shape, StepModel


@dataclass(frozen=True)
class KernelCount:
    """One kernel class over a window: seconds (as the step-time model priced it), FLOPs,
    bytes, and the seconds each convention charges to prompts."""

    seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    prefill_s_by_kernel: float = 0.0


@dataclass(frozen=True)
class PhaseSplit:
    """A window's busy time split between prompt work and decode rows, two ways, and counts."""

    steps: int                     # forwards inside the window
    mixed_steps: int               # of which carried prompt work and decode rows together
    prompt_tokens: int             # prompt tokens computed (chunks and whole prompts)
    decode_rows: int               # decode rows (one output token each)
    busy_s: float                  # the forwards' seconds, as the simulator charged them
    prefill_s_by_tokens: float     # the window's own convention
    prefill_s_by_kernel: float
    kernels: dict = field(default_factory=dict)   # kernel class name -> KernelCount

    @property
    def decode_s_by_tokens(self) -> float:
        return self.busy_s - self.prefill_s_by_tokens

    @property
    def decode_s_by_kernel(self) -> float:
        return self.busy_s - self.prefill_s_by_kernel

    def prefill_share(self, convention: str) -> float:
        """Share of the busy time charged to prompts under ``convention`` ("tokens" or
        "kernels")."""
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        part = self.prefill_s_by_tokens if convention == "tokens" else self.prefill_s_by_kernel
        return part / self.busy_s

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PhaseSplit":
        return cls(**{**d, "kernels": {k: KernelCount(**v) for k, v in d["kernels"].items()}})


CONVENTIONS = ("tokens", "kernels")


def _kernel_shares(costs: StepModel, prompt: Shape | None, decode: Shape | None):
    """(name, seconds, flops, bytes, prefill seconds by kernel time) of one forward."""
    whole = prompt if decode is None else decode if prompt is None else prompt + decode
    alone_p = {k.name: k.seconds for k in costs.kernels(prompt)} if prompt else {}
    alone_d = {k.name: k.seconds for k in costs.kernels(decode)} if decode else {}
    for k in costs.kernels(whole):
        p, d = alone_p.get(k.name, 0.0), alone_d.get(k.name, 0.0)
        share = p / (p + d) if p + d > 0 else (1.0 if decode is None else 0.0)
        yield k.name, k.seconds, k.flops, k.bytes, share * k.seconds


def split_run(run, costs: StepModel, t0: float, t1: float) -> PhaseSplit:
    """The forwards of ``run`` (a simulated ``Run`` timed by ``costs``) that start in
    [t0, t1), split both ways. Each forward's kernels are recomputed from its rows; their sum
    (plus the model's fixed overhead, charged by tokens) must equal the seconds the simulator
    charged, which the caller can check against ``busy_s``."""
    steps = mixed = prompt_tokens = decode_rows = 0
    busy = by_tokens = by_kernel = 0.0
    counts: dict[str, list[float]] = {}
    window = costs.attention.window
    for it in run.iterations:
        if not t0 <= it.start_s < t1:
            continue
        for f in it.forwards:
            chunks = [(r.new, r.cached) for r in f.rows if r.prefill]
            decodes = [(1, r.cached) for r in f.rows if not r.prefill]
            prompt = Shape.of_rows(chunks, window) if chunks else None
            decode = Shape.of_rows(decodes, window) if decodes else None
            steps, mixed = steps + 1, mixed + bool(chunks and decodes)
            prompt_tokens += sum(n for n, _ in chunks)
            decode_rows += len(decodes)
            busy += f.seconds
            by_tokens += f.prefill_share * f.seconds
            kernel_prefill = f.prefill_share * costs.overhead_s
            for name, s, flops, nbytes, p_s in _kernel_shares(costs, prompt, decode):
                c = counts.setdefault(name, [0.0, 0.0, 0.0, 0.0])
                c[0], c[1], c[2], c[3] = c[0] + s, c[1] + flops, c[2] + nbytes, c[3] + p_s
                kernel_prefill += p_s
            by_kernel += kernel_prefill
    return PhaseSplit(steps, mixed, prompt_tokens, decode_rows, busy, by_tokens, by_kernel,
                      {k: KernelCount(*v) for k, v in counts.items()})
