"""dsv4patch.proofs.selftest.node: the environment probe (``child.py --probe``) and its answer, validated.

The probe runs for real under this interpreter (no torch here: no device) and
under the CPU test venv's interpreter (torch on CPU: still no device); the
answers of a GPU node are checked as JSON, since no GPU is here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4patch.proofs.selftest import node, plan, runner

CHILD = Path(node.__file__).resolve().parent / "child.py"
H200 = {"python": "/opt/py", "vllm": "0.26.0", "torch": "2.11.0", "torch_cuda": "13.0", "pytest": "9.0",
        "devices": [{"index": 0, "name": "NVIDIA H200", "capability": "9.0", "free_bytes": 140 * 2**30,
                     "total_bytes": 150 * 2**30}]}


def test_the_real_probe_in_an_interpreter_without_torch():
    res = subprocess.run([sys.executable, str(CHILD), "--probe"], capture_output=True, text=True, timeout=120)
    got = node.parse_probe(res.stdout)
    assert res.returncode == 0 and got.python == sys.executable
    assert got.devices == () and got.gpu is None and got.vllm is None
    assert any(e.startswith("torch: ") for e in got.errors) or got.torch is None
    assert "no CUDA device" in got.describe()


def test_probe_node_runs_the_child_under_the_deadline_and_refuses_a_non_interpreter(tmp_path):
    got = runner.probe_node([sys.executable, str(CHILD)])
    assert got.gpu is None
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho '{not json'\n")
    fake.chmod(0o755)
    with pytest.raises(node.ProbeError, match="not valid JSON"):
        runner.probe_node([str(fake)])
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 600\n")
    hang.chmod(0o755)
    with pytest.raises(node.ProbeError, match="did not finish within 2 s"):
        runner.probe_node([str(hang)], deadline=2)


def test_a_gpu_nodes_answer_is_read_after_library_chatter():
    got = node.parse_probe("WARNING something\n" + json.dumps(H200) + "\n")
    assert got.gpu == node.Device(0, "NVIDIA H200", "9.0", 140 * 2**30, 150 * 2**30)
    assert got.describe() == "vLLM 0.26.0, torch 2.11.0+cu13.0, NVIDIA H200 (sm_90, 140.0 of 150.0 GiB free)"


@pytest.mark.parametrize("answer", [
    "[]", '{"devices": "x"}', '{"devices": [{"index": 0}]}',
    json.dumps({**H200, "devices": [{**H200["devices"][0], "free_bytes": 2**50}]}),
    json.dumps({**H200, "vllm": "x" * 1000}), "[" * 100_000, "",
])
def test_a_bad_answer_is_a_probe_error_never_a_crash(answer):
    with pytest.raises(node.ProbeError):
        node.parse_probe(answer)


def test_the_real_probe_here_sees_no_gpu_so_a_two_gpu_topology_is_refused():
    """This machine has no GPU: the real probe counts 0 devices and an engine of TP 2 (or PP 2) is refused."""
    got = runner.probe_node([sys.executable, str(CHILD)])
    assert len(got.devices) == 0
    for topology in (plan.Topology(2, 1), plan.Topology(1, 2)):
        with pytest.raises(plan.NotEnoughGpus, match=r"needs 2 CUDA devices; .* sees 0 \(none\); nothing was "
                                                     "started") as err:
            plan.check_gpus(topology, got)
        assert err.value.exit_code == 2
    plan.check_gpus(plan.Topology(), got)  # one GPU: the engine cases are needs-gpu, the checks run


def test_a_gpu_nodes_answer_counts_its_devices():
    eight = {**H200, "devices": [{**H200["devices"][0], "index": i} for i in range(8)]}
    got = node.parse_probe(json.dumps(eight))
    assert [d.index for d in got.devices] == list(range(8)) and got.gpu == got.devices[0]
    plan.check_gpus(plan.Topology(4, 2), got)
    with pytest.raises(plan.NotEnoughGpus, match="needs 16 CUDA devices"):
        plan.check_gpus(plan.Topology(8, 2), got)
