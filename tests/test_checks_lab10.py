"""Every Lab 10 check passes a correct answer, lends the reference to an unattempted one, and
fails a planted bug with a message that names the call, the expected value and a hint."""

import pytest
import torch
import torch.nn.functional as F

from check_contract import contract
from inferlab.analysis.moe import expected_experts
from inferlab.course.checks import CheckFailed, lab10
from inferlab.model.moe import route
from inferlab.parallel.tensor import split_mlp


def _rows(gate, up, down, rank, n):
    F_r = gate.shape[0] // n
    s = slice(rank * F_r, (rank + 1) * F_r)
    return gate[s], up[s], down[:, s]


def _top_k_probs(logits, k):  # not renormalised
    probs = F.softmax(logits.float(), -1)
    w, e = probs.topk(k, dim=-1)
    return w, e


CASES = {
    "all_reduce_bytes": (lambda L, d, b: 2 * L * d * b, [
        lambda L, d, b: L * d * b,                  # one all-reduce per layer
        lambda L, d, b: 2 * L * d,                  # elements, not bytes
        lambda L, d, b: 2 * L * d * b * 2]),        # counted twice (a ring's 2(N-1)/N at N=2)
    "split_mlp": (_rows, [
        lambda g, u, d, r, n: (g[:, r * g.shape[1] // n:(r + 1) * g.shape[1] // n],
                               u[:, r * u.shape[1] // n:(r + 1) * u.shape[1] // n],
                               d[r * d.shape[0] // n:(r + 1) * d.shape[0] // n]),  # transposed
        lambda g, u, d, r, n: (_rows(g, u, d, r, n)[0], _rows(g, u, d, r, n)[1],
                               _rows(g, u, d, (r + 1) % n, n)[2]),   # down from another rank
        lambda g, u, d, r, n: (g, u, d)]),                            # no split at all
    "route": (lambda logits, k: route(logits, k), [
        _top_k_probs,                                                  # not renormalised
        lambda logits, k: (torch.full((logits.shape[0], k), 1 / k),
                           logits.topk(k, dim=-1, largest=False).indices),  # smallest
        lambda logits, k: (F.softmax(logits.topk(k, -1).values, -1),
                           logits.topk(k, -1).indices.flip(-1))]),  # experts in the wrong order
    "expected_experts": (lambda b, e, k: e * (1 - (1 - k / e) ** b), [
        lambda b, e, k: min(e, k * b),                                 # no overlap
        lambda b, e, k: e * (1 - (1 - 1 / e) ** b),                    # k forgotten
        lambda b, e, k: e * (1 - (1 - k / e)) ** b]),                  # power misplaced
}

(test_correct_answer_passes_and_is_returned, test_unattempted_exercise_gets_the_reference,
 test_planted_bug_fails_with_an_actionable_message,
 test_planted_bug_in_a_notebook_reports_and_lends_the_reference) = contract(
    lab10, CASES, 10, words=("expected", "Hint:"))


def test_the_references_are_the_packages():
    assert lab10.split_mlp(lambda *a: (_ for _ in ()).throw(NotImplementedError())) is split_mlp
    assert lab10.expected_experts(lambda *a: (_ for _ in ()).throw(NotImplementedError())) \
        is expected_experts


def test_specific_hints():
    with pytest.raises(CheckFailed, match="one all-reduce per layer is missing"):
        lab10.all_reduce_bytes(CASES["all_reduce_bytes"][1][0])
    with pytest.raises(CheckFailed, match="not its rows|not its columns"):
        lab10.split_mlp(CASES["split_mlp"][1][0])
    with pytest.raises(CheckFailed, match="renormalised"):
        lab10.route(CASES["route"][1][0])
    with pytest.raises(CheckFailed, match="smallest"):
        lab10.route(CASES["route"][1][1])
    with pytest.raises(CheckFailed, match="counts an expert twice"):
        lab10.expected_experts(CASES["expected_experts"][1][0])
