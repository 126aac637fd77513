"""Checks for Lab 6, "Speculative decoding".

Oracles that need no solution:

- greedy verification: the target's own greedy output (``inferlab.model.generate.generate``),
  token for token, for every k, with the course's trained pair in float64 so that no rounding
  can flip a greedy choice;
- the rejection rule: the distribution of the emitted tokens against the target's p, by a
  chi-square test whose false-alarm rate is stated (``FALSE_ALARM``) and whose trials are
  seeded, so a check's verdict never changes between runs;
- the expected tokens per verification against ``inferlab.analysis.speculation``;
- prompt lookup against the rule as the lab states it (``inferlab.model.speculative``);
- rollback in the paged cache: the block tables' invariants and the allocator's free count
  after many rejections, and a paged speculative generation equal to plain greedy.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from inferlab.analysis import speculation
from inferlab.course.checks import CheckFailed, expect_close, expect_equal, lends, run_check
from inferlab.model import speculative

# Points per exercise for the grader's score (inferlab.course.grade; an instructor's
# --weights file overrides them): more for the exercises that are more code.
WEIGHTS = {"6.1": 2, "6.2": 1, "6.3": 3, "6.4": 2, "6.5": 2}

FALSE_ALARM = 1e-3  # the chance that a correct rule fails the distribution test (all tests together)


def chi_square(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0):
    """Pearson's chi-square of observed ``counts`` against ``probs``: (statistic, dof, p-value).

    Outcomes expected fewer than ``min_expected`` times are pooled into one bin, where the
    chi-square approximation holds. The p-value is the upper tail of the chi-square law,
    Q(dof / 2, statistic / 2), the regularised upper incomplete gamma function.
    """
    counts, probs = counts.double(), probs.double() / probs.sum()
    n = float(counts.sum())
    expected = probs * n
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    if bool((obs[~keep] > 0).any()):  # a token the target gives probability 0 was emitted
        return math.inf, int(keep.sum()) - 1, 0.0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = max(int(obs.numel()) - 1, 1)
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, dof, p_value


@lru_cache(maxsize=1)
def _pair():
    from inferlab.model.weights import checkpoint_path, load_checkpoint

    target = load_checkpoint(checkpoint_path("course-target")).to(torch.float64)
    draft = load_checkpoint(checkpoint_path("course-draft")).to(torch.float64)
    return target, draft


@lru_cache(maxsize=1)
def _prompts() -> tuple[tuple[int, ...], ...]:
    from inferlab.model.corpus import held_out
    from inferlab.model.weights import checkpoint_path, load_tokenizer

    tok = load_tokenizer(checkpoint_path("course-target"))
    docs = held_out("validation")
    return tuple(tuple(tok.encode(d.text[:400])[:24]) for d in docs[:2])


def _greedy_reference(prompt, n):
    from inferlab.model.generate import generate

    return generate(_pair()[0], torch.tensor(prompt), n)[0].tolist()


# The usual slips in greedy verification, each as the output it gives (from the target's
# choices ``c`` at rows 0..k and the drafts ``d``), with the hint that names it. A learner's wrong
# output that one of them reproduces on every case gets that slip's hint.
def _slip(judge, emit):
    def output(c: list[int], d: list[int]) -> list[int]:
        out = []
        for i, x in enumerate(d):
            if x != c[judge(i, len(d))]:
                break
            out.append(x)
        return out + [c[emit(len(out), len(d))]]
    return output


_GREEDY_SLIPS = (
    (_slip(lambda i, k: i + 1, lambda n, k: n),
     "each draft was judged by the row after its own. Row i of the logits predicts the token "
     "AFTER position i, so draft d_1 (drafted[0]) is judged by row 0, the logits at the last "
     "committed token, and drafted[i] by row i."),
    (_slip(lambda i, k: i + 1, lambda n, k: min(n + 1, k)),
     "every row was read one too late: drafted[i] is judged by row i, and after n kept drafts "
     "the target's own token is row n's choice (row k, the bonus, when all k are kept)."),
    (_slip(lambda i, k: i, lambda n, k: min(n + 1, k)),
     "at the first mismatch, emit the target's choice at that same position (row i: the token "
     "it wants in place of the rejected draft), not the next row's."),
    (_slip(lambda i, k: i - 1, lambda n, k: n),
     "drafted[i] is judged by row i; row i - 1 at i = 0 is row -1, the last row, in Python."),
)


def _diagnose(outputs: list[tuple[list[int], list[int], list[int]]]) -> str | None:
    """The hint of the one slip that reproduces every (choices, drafts, got) in ``outputs``."""
    for model, hint in _GREEDY_SLIPS:
        if all(model(c, d) == got for c, d, got in outputs):
            return hint
    return None


def greedy_verify(fn):
    """Exercise 6.1: ``greedy_verify(logits, drafted) -> list[int]``: the accepted drafts and one
    token of the target's own."""
    def cases(f):
        V = 8
        top = torch.tensor([3, 1, 4, 1, 5])  # the target's argmax at each of 5 positions
        logits = torch.nn.functional.one_hot(top, V).double()  # (k + 1, V) with k = 4
        table = (
            ([3, 1, 4, 1], [3, 1, 4, 1, 5], "when every draft matches, the last row of the "
             "logits gives one more token: k + 1 tokens for one pass."),
            ([3, 1, 0, 1], [3, 1, 4], "stop at the first mismatch and emit the target's own "
             "token there; later drafts are never kept, even if they match."),
            ([7, 1, 4, 1], [3], "row i of the logits predicts the token AFTER position i: "
             "draft d_1 is judged by row 0 (the logits at the last committed token)."),
            ([1, 4, 1, 5], [3], "row i of the logits predicts the token AFTER position i: "
             "draft d_1 is judged by row 0, not row 1."),
            ([], [3], "with nothing drafted, a verification is a plain decode step."))
        outputs = []
        for drafted, _, _ in table:
            got = f(logits[:len(drafted) + 1], torch.tensor(drafted, dtype=torch.long))
            outputs.append((top[:len(drafted) + 1].tolist(), drafted, [int(t) for t in got]))
        slip = _diagnose(outputs)
        for (drafted, want, hint), (_, _, got) in zip(table, outputs):
            expect_equal(f"greedy_verify(logits with argmax {top[:len(drafted) + 1].tolist()}, "
                         f"drafted={drafted})", got, want, hint=slip or hint)
        target, draft = _pair()
        for prompt in _prompts():
            want = _greedy_reference(prompt, 24)
            for k in (1, 2, 3, 5):
                got, _ = speculative.speculative_generate(
                    target, speculative.ModelDrafter(draft), prompt, 24, k=k, verify=f)
                expect_equal(f"speculative greedy generation with k={k} (24 tokens)", got, want,
                             hint="the output must be the target's own greedy output.")
    return run_check("6.1", "greedy_verify", fn, speculative.greedy_verify, cases,
                     success="speculative greedy output equals the target's greedy output for "
                             "k = 1, 2, 3 and 5.")


def expected_tokens(fn):
    """Exercise 6.2: ``expected_tokens(a, k)``: expected tokens per verification,
    (1 - a^(k+1)) / (1 - a)."""
    def cases(f):
        for a, k in ((0.0, 4), (0.5, 1), (0.6, 4), (0.8, 7), (0.95, 16), (1.0, 5), (0.3, 0)):
            want = speculation.expected_tokens(a, k)
            hint = "sum the chances 1 + a + ... + a^k: the token i+1 is emitted iff drafts 1..i are kept."
            if a == 1.0:
                hint = "at a = 1 the formula divides 0 by 0: every draft is kept, so k + 1 tokens."
            try:
                got = f(a, k)
            except ZeroDivisionError:
                raise CheckFailed(f"expected_tokens(a={a}, k={k}) divided by zero.\n  Hint: "
                                  f"{hint}") from None
            try:
                if abs(float(got) - (want - a ** k)) < 1e-9 and a not in (0.0, 1.0):
                    hint = "the bonus token counts too: k drafts give up to k + 1 tokens, so a^(k+1)."
            except (TypeError, ValueError):
                pass
            expect_close(f"expected_tokens(a={a}, k={k})", got, want, rel=1e-9, hint=hint)
    reference = lends(lambda a, k: speculation.expected_tokens(a, k), speculation.expected_tokens)
    return run_check("6.2", "expected_tokens", fn, reference, cases)


# Distributions for the sampling test: the draft is wrong in both directions (too sure of
# token 0, blind to token 4), so a rule that skips the ratio or the residual is caught.
_P = torch.tensor([[0.10, 0.30, 0.05, 0.15, 0.30, 0.10],
                   [0.40, 0.05, 0.20, 0.05, 0.10, 0.20],
                   [0.15, 0.15, 0.30, 0.20, 0.10, 0.10]], dtype=torch.float64)
_Q = torch.tensor([[0.50, 0.20, 0.10, 0.15, 0.00, 0.05],
                   [0.10, 0.30, 0.30, 0.10, 0.10, 0.10]], dtype=torch.float64)
_TRIALS = 4000


def _sampled(f, seed: int = 6):
    """Run ``f`` on ``_TRIALS`` seeded trials; returns the emitted lists."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(_TRIALS):
        drafted = torch.multinomial(_Q, 1, generator=gen).squeeze(-1)  # (k,) drawn from q
        got = [int(t) for t in f(_P, _Q, drafted, gen)]
        if not 1 <= len(got) <= len(drafted) + 1:
            raise CheckFailed(f"sampling_verify returned {len(got)} tokens for k={len(drafted)}; "
                              "expected 1 to k + 1.\n  Hint: the accepted drafts, then exactly "
                              "one token: the residual's sample or the bonus.")
        accepted = len(got) - 1
        if got[:accepted] != drafted[:accepted].tolist():
            raise CheckFailed(f"sampling_verify returned {got} for drafts "
                              f"{drafted.tolist()}: the kept tokens must be the drafts, in order."
                              "\n  Hint: the accepted drafts, then one token.")
        out.append(got)
    return out


def sampling_verify(fn):
    """Exercise 6.3: ``sampling_verify(p, q, drafted, generator) -> list[int]``: the rejection rule
    and the residual distribution; the emitted tokens are distributed as the target's p."""
    def cases(f):
        same = f(_P, _P[:2], torch.tensor([1, 0]), torch.Generator().manual_seed(0))
        if len(same) != 3:
            raise CheckFailed(f"with q equal to p every draft must be kept (p / q = 1), but "
                              f"sampling_verify returned {list(same)} for drafts [1, 0].\n  "
                              "Hint: accept with probability min(1, p(x) / q(x)), for example "
                              "when a uniform r satisfies r * q(x) < p(x).")
        runs = _sampled(f)
        V = _P.shape[1]
        first = torch.bincount(torch.tensor([r[0] for r in runs]), minlength=V)
        second = torch.bincount(torch.tensor([r[1] for r in runs if len(r) > 1]), minlength=V)
        for what, counts, row in (("first", first, 0), ("second", second, 1)):
            stat, dof, p_value = chi_square(counts, _P[row])
            if p_value < FALSE_ALARM / 2:  # two tests: the false alarms add up to FALSE_ALARM
                share = (counts.double() / counts.sum()).tolist()
                hint = ("a rejected draft is replaced by a sample from the residual "
                        "max(0, p - q) normalised, not from p: p has already had its chance "
                        "through the accepted drafts.")
                if torch.allclose(torch.tensor(share, dtype=torch.float64), _Q[row], atol=0.03):
                    hint = ("the tokens follow the draft's q: accept x with probability "
                            "min(1, p(x) / q(x)), not always.")
                raise CheckFailed(
                    f"over {int(counts.sum())} trials the {what} emitted token's frequencies are "
                    f"{[round(s, 3) for s in share]}, but the target's p is "
                    f"{_P[row].tolist()} (chi-square {stat:.1f} on {dof} degrees of freedom, "
                    f"p-value {p_value:.2g}; a correct rule fails this test with probability "
                    f"{FALSE_ALARM / 2:g}).\n  Hint: {hint}")
    return run_check("6.3", "sampling_verify", fn, speculative.sampling_verify, cases,
                     success=f"over {_TRIALS} seeded trials the first and second emitted tokens "
                             f"follow the target's p (chi-square tests, false-alarm rate "
                             f"{FALSE_ALARM:g} in all).")


_LOOKUPS = [
    ([1, 2, 3, 9, 1, 2, 3], 3, [9, 1, 2]),          # the trigram 1 2 3 came before: copy on
    ([5, 6, 7, 5, 6, 8, 5, 6], 2, [8, 5]),          # the LATEST match of 5 6 wins
    ([4, 4, 4, 4], 5, [4, 4, 4, 4, 4]),             # a period of 1: the copy runs into the tail
    ([1, 2, 1, 2, 1, 2], 4, [1, 2, 1, 2]),          # a period of 2
    ([7, 8, 9], 3, []),                            # no earlier match at all
    ([3, 1, 2, 0, 2, 7, 1, 2], 2, [0, 2]),          # the longest n-gram (1 2) beats the latest 2
]


def prompt_lookup(fn):
    """Exercise 6.4: ``prompt_lookup(tokens, k, max_ngram=3) -> list[int]``: the tokens after the
    latest earlier match of the longest matching tail n-gram, copying on past the end."""
    def cases(f):
        for tokens, k, want in _LOOKUPS:
            got = [int(t) for t in f(list(tokens), k, 3)]
            hint = "find the latest earlier occurrence of the last n tokens (n = 3, then 2, then 1)."
            if want and got == want[:len(got)] and len(got) < len(want):
                hint = ("copy on past the sequence's end: the tokens you append are part of the "
                        "sequence you copy from (start + n + j may reach them).")
            elif tokens == [5, 6, 7, 5, 6, 8, 5, 6]:
                hint = "take the LATEST earlier match: recent text predicts the next tokens best."
            elif not want:
                hint = "the match must end before the tail: the tail always matches itself."
            elif tokens[0] == 3:
                hint = "try the longest n-gram first: a longer match is stronger evidence."
            expect_equal(f"prompt_lookup({tokens}, k={k})", got, want, hint=hint)
    return run_check("6.4", "prompt_lookup", fn, speculative.prompt_lookup, cases)


def _reference_truncate(table, num_tokens):
    table.truncate(num_tokens)


def truncate(fn):
    """Exercise 6.5: ``truncate(table, num_tokens)``: roll a block table back after a
    verification, freeing the blocks that held only rejected tokens."""
    from inferlab.serving.paged_cache import BlockAllocator, BlockTable, blocks_for

    def cases(f):
        gen = torch.Generator().manual_seed(5)
        alloc = BlockAllocator(512)
        tables = [BlockTable(alloc, 4) for _ in range(3)]
        for t in tables:
            t.append(int(torch.randint(1, 9, (1,), generator=gen)))
        tables.append(tables[0].fork())  # shared blocks: a rollback must not free them for both
        for step in range(300):
            t = tables[step % len(tables)]
            k = int(torch.randint(1, 7, (1,), generator=gen))
            before = t.num_tokens
            t.append(k + 1)  # the verification's k + 1 slots
            kept = int(torch.randint(1, k + 2, (1,), generator=gen))
            f(t, before + kept)
            where = (f"after a verification of k={k} on a table of {before} tokens "
                     f"(block size 4) kept {kept}")
            expect_equal(f"table.num_tokens {where}", t.num_tokens, before + kept,
                         hint="set table.num_tokens to the tokens kept.")
            need = blocks_for(before + kept, 4)
            expect_equal(f"len(table.blocks) {where}", len(t.blocks), need,
                         hint="keep ceil(num_tokens / block_size) blocks (blocks_for); a partly "
                              "filled last block still holds kept tokens." if len(t.blocks) < need
                         else "blocks past the kept tokens leak: give each back with "
                              "table.allocator.free(block) and drop it from table.blocks.")
            owners = sum(len(x.blocks) for x in tables)
            in_use = alloc.num_blocks - alloc.num_free
            refs = sum(alloc.refcount(b) for b in range(alloc.num_blocks))
            if refs != owners:
                raise CheckFailed(f"{where}: the tables hold {owners} block references but the "
                                  f"allocator counts {refs} ({in_use} blocks in use): blocks "
                                  "leak.\n  Hint: give each dropped block back with "
                                  "table.allocator.free(block), last block first.")
        for t in tables:
            t.free()
        expect_equal("free blocks after 300 verifications and freeing every table",
                     alloc.num_free, alloc.num_blocks, hint="every dropped block must be freed.")
        from inferlab.serving.config import ServingConfig
        from inferlab.serving.paged_cache import PagedKVCache

        target, draft = _pair()
        prompt = _prompts()[0]
        cache = PagedKVCache.for_model(target, ServingConfig(num_blocks=16, block_size=4))
        runner = speculative.PagedTarget(target, cache, truncate=f)
        got, _ = speculative.speculative_generate(target, speculative.ModelDrafter(draft), prompt,
                                                  24, k=4, target_cache=runner)
        expect_equal("speculative greedy generation over the paged cache (k=4)", got,
                     _greedy_reference(prompt, 24),
                     hint="the kept tokens' K/V must stay where they are.")
        runner.table.free()
        expect_equal("free blocks after the paged generation", cache.allocator.num_free,
                     cache.allocator.num_blocks, hint="every dropped block must be freed.")
    reference = lends(_reference_truncate, BlockTable.truncate)
    return run_check("6.5", "truncate", fn, reference, cases,
                     success="300 rollbacks on four tables (one forked) leaked no block, and a "
                             "paged speculative generation equals plain greedy.")
