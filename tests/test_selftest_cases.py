"""dsv4patch.proofs.selftest.cases: the engines, prompt sets and --cases selection."""

from __future__ import annotations

import pytest

from dsv4patch.errors import UsageError
from dsv4patch.proofs.selftest import cases, model


def test_prompt_sets_cross_the_window_and_a_kv_block():
    sets = {s.name: s for s in cases.prompt_sets()}
    assert set(sets) == {"trio_b3", "short_b5", "mid_b24", "long_b3", "short_b1", "long_b1"}
    for s in sets.values():
        assert len(s.prompts) == len(s.max_tokens)
        for p, n in zip(s.prompts, s.max_tokens, strict=True):
            assert all(2 <= t < model.NOISE_TOKEN for t in p)
            assert len(p) + n <= model.MAX_POSITION
    assert max(sets["short_b1"].max_tokens) + len(sets["short_b1"].prompts[0]) > model.BLOCK_SIZE
    assert min(len(p) for p in sets["mid_b24"].prompts) > 1 + 3  # no prompt scheduled as a decode at MTP 3
    assert len(set(sets["short_b5"].max_tokens)) == 5  # the batch drains: padded decode slots
    assert len(sets["mid_b24"].prompts) == 24 and max(len(p) for p in sets["long_b3"].prompts) > 2 * 1024
    # fix 6/7's shape: three requests, each a prefill (longer than 1 + k at MTP 3), all decoding together at first
    trio = sets["trio_b3"]
    assert len(trio.prompts) == 3 and min(len(p) for p in trio.prompts) > 1 + 3 and min(trio.max_tokens) >= 24


def test_every_method_and_the_diagnostic_engine():
    names = [c.name for c in cases.all_cases()]
    assert {c.split("/")[0] for c in names} == {"plain", "mtp1", "mtp2", "mtp3", "dspark5"}
    forced = cases.all_cases(force_sm120_topk=True)
    assert forced[0].engine.sm120_topk and forced[0].engine.speculative_config() == {
        "method": "mtp", "num_speculative_tokens": 1}
    assert [c.prompts.name for c in forced if c.engine.sm120_topk] == list(cases.SM120_SETS)
    assert cases.ENGINES[0].speculative_config() is None


def test_select_by_engine_set_and_wildcard_keeps_run_order():
    every = cases.all_cases()
    assert [c.name for c in cases.select(every, ["mtp2/long_b1", "plain"])][:1] == ["plain/trio_b3"]
    assert [c.name for c in cases.select(every, ["*/short_b1"])] == [
        f"{e}/short_b1" for e in ("plain", "mtp1", "mtp2", "mtp3", "dspark5")]
    assert cases.select(every, None) == every
    with pytest.raises(UsageError, match="no such case.*engines: dspark5"):
        cases.select(every, ["mtp1-sm120topk"])
