"""dsv4patch.proofs.selftest.plan: engines sized from free GPU memory, their order, warm start deadlines."""

from __future__ import annotations

from dsv4patch.proofs.selftest import cases, plan
from dsv4patch.proofs.selftest.node import Device

GIB = 2**30
H200 = Device(0, "NVIDIA H200", "9.0", 143_000 * 2**20, 150_106_341_376)


def test_an_idle_h200_fits_eight_engines_of_sixteen_gib():
    s = plan.size_engines(H200, kv_cache_bytes=6 * GIB, most=64)
    assert s.per_engine_bytes == 16 * GIB and s.gpu_memory_utilization == 0.115 and s.parallel == 8
    assert plan.size_engines(H200, kv_cache_bytes=6 * GIB, most=3).parallel == 3


def test_the_run_that_crashed_on_4_gib_free_is_refused_with_both_figures():
    crowded = Device(0, "NVIDIA H200", "9.0", int(4.17 * GIB), H200.total_bytes)
    s = plan.size_engines(crowded, kv_cache_bytes=6 * GIB, most=6)
    assert s.parallel == 0
    assert s.describe() == "one engine needs 16.0 GiB free on the GPU, 4.2 of 139.8 GiB are free"


def test_the_warm_up_engine_first_dspark_early_the_diagnostic_last():
    every = [c.engine for c in cases.all_cases(force_sm120_topk=True)]
    engines = list(dict.fromkeys(every))
    assert [e.name for e in plan.engine_order(engines)] == [
        "mtp1", "dspark5", "plain", "mtp2", "mtp3", "mtp1-sm120topk"]
    diag = [e for e in engines if e.sm120_topk]
    assert plan.engine_order(diag) == diag  # alone it is also the first


def test_a_warm_start_deadline_follows_the_first_engines_measured_start():
    assert plan.warm_start_deadline(420, None) == 420
    assert plan.warm_start_deadline(420, 60) == plan.MIN_WARM_START
    assert plan.warm_start_deadline(420, 200) == 300
    assert plan.warm_start_deadline(420, 400) == 420
