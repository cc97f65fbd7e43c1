"""dsv4patch.proofs.selftest.oracle: the designed chain, the first difference, the acceptance the design implies."""

from __future__ import annotations

from dsv4patch.proofs.selftest import oracle
from dsv4patch.proofs.selftest.model import DESIGN


def test_expected_tokens_follow_the_prompts_last_token():
    want = oracle.expected_tokens([[5, 9, 17], [300]], [4, 2])
    assert want[0] == DESIGN.chain(17, 4) and want[1] == DESIGN.chain(300, 2)
    assert want[0][1] == DESIGN.successor[want[0][0]]


def test_first_difference_names_request_position_and_both_tokens():
    want = [[1, 2, 3], [4, 5, 6]]
    assert oracle.first_difference(want, [[1, 2, 3], [4, 5, 6]]) is None
    d = oracle.first_difference(want, [[1, 2, 3], [4, 7, 6]])
    assert (d.request, d.position, d.expected, d.got) == (1, 1, 5, 7)
    assert d.describe() == "request 1, token 1: expected 5, got 7"
    short = oracle.first_difference(want, [[1, 2], [4, 5, 6]])
    assert (short.request, short.position, short.expected, short.got) == (0, 2, 3, None)
    missing = oracle.first_difference(want, [[1, 2, 3]])
    assert (missing.request, missing.got) == (1, None)


def test_min_gap():
    assert oracle.min_gap([[20.0, 19.9], [19.5]]) == 19.5
    assert oracle.min_gap([[], []]) is None


def test_acceptance_is_partial_only_with_both_kinds():
    assert oracle.Acceptance(10, 4).partial and oracle.Acceptance(10, 4).rate == 0.4
    assert not oracle.Acceptance(10, 0).partial and not oracle.Acceptance(10, 10).partial
    assert oracle.Acceptance(0, 0).rate is None


def test_expected_acceptance_simulates_greedy_verification():
    seq = DESIGN.chain(DESIGN.cycle[0], 200)
    one = oracle.expected_acceptance("mtp", 1, [seq])
    # MTP 1: a draft after token t is accepted exactly when t is in ACCEPT
    steps, p, acc = 0, 0, 0
    while p < len(seq) - 1:
        ok = seq[p] in DESIGN.accept
        steps, acc, p = steps + 1, acc + ok, p + 1 + ok
    assert (one.drafted, one.accepted) == (steps, acc)
    for method, k in (("mtp", 1), ("mtp", 2), ("mtp", 3), ("dspark", 5)):
        a = oracle.expected_acceptance(method, k, [seq])
        assert 0.3 < a.rate < 0.9, (method, k, a)
    # DSpark's first draft is always right: at least one accepted token per step
    ds = oracle.expected_acceptance("dspark", 5, [seq])
    assert ds.accepted >= ds.drafted // 5 - 1
