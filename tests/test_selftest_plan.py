"""dsv4patch.proofs.selftest.plan: engines sized from free GPU memory, their order, warm start deadlines."""

from __future__ import annotations

import pytest

from dsv4patch.errors import EXIT_USAGE, UsageError
from dsv4patch.proofs.selftest import cases, plan
from dsv4patch.proofs.selftest.node import Device, Node

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


# ---------------------------------------------------------------------------
# Tensor and pipeline parallelism: the topology, the GPUs it needs, engines on disjoint groups

def _node(n_gpus: int, free: int = H200.free_bytes) -> Node:
    return Node("/opt/py", "0.26.0", "2.11.0", "13.0", "9.0",
                tuple(Device(i, "NVIDIA H200", "9.0", free, H200.total_bytes) for i in range(n_gpus)))


def test_every_topology_the_tiny_model_shards_for_and_the_ones_it_does_not():
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 3, 4):
            assert plan.Topology(tp, pp).problems() == [], (tp, pp)
    assert plan.Topology(2, 4).gpus == 8
    assert plan.Topology(2, 1).describe() == "tensor parallel 2 x pipeline parallel 1 (2 GPUs per engine)"
    assert plan.Topology(3, 1).problems() == ["tensor parallel size 3: must be one of 1, 2, 4, 8"]
    assert plan.Topology(1, 5).problems() == ["pipeline parallel size 5: must be 1 to 4"]
    with pytest.raises(UsageError, match="cannot be spread that way: tensor parallel size 16"):
        plan.Topology(16, 1).validated()


def test_fewer_gpus_than_an_engine_needs_is_refused_with_exit_2():
    with pytest.raises(plan.NotEnoughGpus) as err:
        plan.check_gpus(plan.Topology(2, 2), _node(2))
    assert err.value.exit_code == EXIT_USAGE
    assert str(err.value).startswith("tensor parallel 2 x pipeline parallel 2 (4 GPUs per engine) needs 4 CUDA "
                                     "devices; /opt/py sees 2 (0: NVIDIA H200, 1: NVIDIA H200); nothing was started")
    plan.check_gpus(plan.Topology(2, 2), _node(4))
    plan.check_gpus(plan.Topology(1, 1), _node(0))  # one GPU asked, none here: needs-gpu, not a refusal


def test_multi_gpu_engines_get_disjoint_groups_sized_per_gpu():
    s = plan.size_topology(_node(8).devices, plan.Topology(2, 1), kv_cache_bytes=6 * GIB, most=64)
    assert s.gpus_per_engine == 2 and s.parallel == 4 and s.groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert s.per_engine_bytes == 16 * GIB and s.gpu_memory_utilization == 0.115
    assert s.to_json()["groups"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert "4 engine(s) at once on 2 GPUs each (devices 0,1 | 2,3 | 4,5 | 6,7), 16.0 GiB each per GPU" in s.describe()
    # never more engines at once than groups, nor than asked; an x2 node runs its TP 2 engines one at a time
    assert plan.size_topology(_node(2).devices, plan.Topology(2, 1), kv_cache_bytes=6 * GIB, most=6).groups == (
        (0, 1),)
    assert plan.size_topology(_node(8).devices, plan.Topology(1, 4), kv_cache_bytes=6 * GIB, most=1).groups == (
        (0, 1, 2, 3),)
    # a group with one crowded device is not used; none usable: both figures, nothing runs
    devs = list(_node(4).devices)
    devs[1] = Device(1, "NVIDIA H200", "9.0", 4 * GIB, H200.total_bytes)
    s = plan.size_topology(tuple(devs), plan.Topology(2, 1), kv_cache_bytes=6 * GIB, most=6)
    assert s.groups == ((2, 3),) and s.parallel == 1
    s = plan.size_topology(tuple(devs[:2]), plan.Topology(2, 1), kv_cache_bytes=6 * GIB, most=6)
    assert s.parallel == 0
    assert s.describe() == "one engine needs 16.0 GiB free on each of its GPUs, 4.0 of 139.8 GiB are free"
    # one GPU per engine: the first device, shared, as before
    one = plan.size_topology(_node(8).devices, plan.Topology(), kv_cache_bytes=6 * GIB, most=64)
    assert one == plan.size_engines(H200, kv_cache_bytes=6 * GIB, most=64) and one.groups == ((0,),)
