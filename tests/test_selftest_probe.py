"""dsv4patch.proofs.selftest.probe: a hung engine's evidence, read from a real sleeping child.

faulthandler's dump comes from a real Python child (SIGUSR1 into its stacks
file); py-spy, nvidia-smi and cuda-gdb are not installed here, so the probe
must report each as absent and still write its file.  cuda-gdb's table
format (``info cuda kernels``) is parsed from a sample of its output, since
cuda-gdb needs a GPU.
"""

from __future__ import annotations

import shutil
import sys
import time

from dsv4patch import childproc
from dsv4patch.proofs.selftest import probe

SLEEPER = '''
import faulthandler, signal, sys, time
fh = open(sys.argv[1], "a")
faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True)
def spin_in_kernel():
    time.sleep(600)
print("INFO 12-03 Warming up DeepSeek V4 sparse MLA attention for mixed tokens=2048.", flush=True)
spin_in_kernel()
'''
CUDA_GDB = """\
  Kernel Parent Dev Grid Status   SMs Mask   GridDim  BlockDim Invocation
*      0      -   0    7 Active 0xffffffff (132,1,1) (1024,1,1) vllm::persistent_topk_kernel<1024, 512>(params=...)
"""


def test_collect_dumps_the_stacks_and_names_the_main_threads_frames(tmp_path):
    stacks, out = tmp_path / "e.stacks.txt", tmp_path / "e.probe.txt"
    stacks.write_text("")
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    with childproc.Child([sys.executable, str(script), str(stacks)], what="sleeper", log=tmp_path / "e.log") as c:
        deadline = time.monotonic() + 30
        while "Warming up" not in c.tail() and time.monotonic() < deadline:
            time.sleep(0.1)
        ev = probe.collect(c, stacks=stacks, out=out, tool_deadline=5)
        assert probe.last_log_line(c.tail()).endswith("Warming up DeepSeek V4 sparse MLA attention for mixed "
                                                       "tokens=2048.")
    assert ev.main_frames[:2] == ["spin_in_kernel (sleeper.py:6)", "<module> (sleeper.py:8)"]
    assert ev.tools["faulthandler"] == "ok"
    for tool in ("py-spy", "nvidia-smi", "cuda-gdb"):
        assert ev.tools[tool] == ("absent" if shutil.which(tool) is None else ev.tools[tool])
    assert out.is_file() and "py-spy dump" in out.read_text()
    assert ev.process.startswith("process S (sleeping), threads 1 S, 0.0 CPU s in ")
    assert ev.cpu_used is not None and ev.probed is not None and ev.probed >= 2.0 and ev.cpu_used < 0.5
    assert not ev.working_on_cpu and ev.to_json()["probed"] == ev.probed
    assert "; main thread in spin_in_kernel (sleeper.py:6) <- <module> (sleeper.py:8)" in ev.describe()
    assert "State:\tS (sleeping)" in out.read_text()


def test_cuda_gdbs_resident_kernels_are_named():
    assert probe.kernel_names(CUDA_GDB) == ["vllm::persistent_topk_kernel<1024, 512>(params=...)"]
    assert probe.kernel_names("No CUDA kernels.\n") == []


def test_the_main_thread_is_the_last_block_of_the_latest_dump():
    dump = ('Thread 0x01 (most recent call first):\n  File "/x/worker.py", line 3 in loop\n\n'
            'Current thread 0x02 (most recent call first):\n  File "/x/main.py", line 9 in wait\n'
            '  File "/x/main.py", line 20 in <module>\n')
    assert probe.main_thread_frames(dump) == ["wait (main.py:9)", "<module> (main.py:20)"]
    assert probe.main_thread_frames("") == []


def test_read_tail_never_follows_a_link(tmp_path):
    target = tmp_path / "secret"
    target.write_text("secret")
    (tmp_path / "link").symlink_to(target)
    assert probe.read_tail(tmp_path / "link", 100) == ""
    assert probe.read_tail(target, 3) == "ret"


# Two watchdog dumps of the H200 run of 2026-12-03 (tests/gpu/results/selftest/selftest-stock-work.tgz in git
# history at 8ce1ebb), shortened: the main thread of
# stock vLLM 0.26.0's cold engine start, compiling an mHC kernel with TileLang on an idle GPU (not a hang),
# and of the same engine warm, blocked in Triton's module load behind persistent_topk spinning on the GPU.
COLD = '''Timeout (0:06:20)!
Thread 0x00007fdd05fff6c0 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait

Thread 0x00007fe22344b140 (most recent call first):
  File "/tmp/selftest/deps/tilelang/3rdparty/tvm/python/tvm/ir/transform.py", line 167 in __call__
  File "/tmp/selftest/deps/tilelang/engine/phase.py", line 191 in LowerAndLegalize
  File "/tmp/selftest/deps/tilelang/engine/lower.py", line 308 in lower
  File "/tmp/selftest/site/vllm/model_executor/kernels/mhc/tilelang.py", line 232 in mhc_pre_tilelang
'''
WARM_HANG = '''Timeout (0:01:54)!
Thread 0x00007f49fbad0140 (most recent call first):
  File "/opt/torch/.venv/lib/python3.12/site-packages/triton/compiler/compiler.py", line 465 in _init_handles
  File "/opt/torch/.venv/lib/python3.12/site-packages/triton/runtime/jit.py", line 743 in run
  File "/tmp/selftest/site/vllm/v1/sample/rejection_sampler.py", line 458 in rejection_sample
'''


def test_a_cold_compile_on_an_idle_gpu_is_not_a_hang_a_spinning_kernel_is():
    assert probe.compiling(COLD) == "TileLang: __call__ (tvm/ir/transform.py:167)"
    assert probe.compiling(WARM_HANG) == ""  # Triton loads a module there; it does not compile
    cold = probe.HangEvidence("x", gpu="0 %, 16235 MiB, 143771 MiB", compiler=probe.compiling(COLD))
    assert cold.still_compiling
    hang = probe.HangEvidence("x", gpu="100 %, 10921 MiB, 143771 MiB",
                              kernels=["vllm::persistent::persistent_topk_kernel<512, 4u>() "])
    assert not hang.still_compiling
    busy = probe.HangEvidence("x", gpu="100 %, 1 MiB, 2 MiB", compiler=probe.compiling(COLD))
    assert not busy.still_compiling  # compiling, but the GPU is busy too: a hang is not ruled out


def test_a_start_busy_on_the_host_is_told_from_a_spinning_kernel_and_a_deadlock():
    # The hang probes of the H200 runs of 2026-12-04 (tests/gpu/results/selftest/*-5d918fa-*): dspark5's start in
    # vLLM's graph capture (gc.collect(), GPU idle, no kernel resident, 2.1 CPU s in 2 s), and stock's trio_b3
    # (persistent_topk resident, GPU 100 %, the main thread spinning beside it in Triton's module load, 10.2 CPU s
    # in 10 s).
    slow = probe.HangEvidence("x", gpu="0 %, 11269 MiB, 143771 MiB", cpu_used=2.1, probed=2.0)
    assert slow.working_on_cpu and not slow.still_compiling
    hang = probe.HangEvidence("x", gpu="100 %, 11115 MiB, 143771 MiB", cpu_used=10.2, probed=10.0,
                              kernels=["vllm::persistent::persistent_topk_kernel<512, 4u>() "])
    assert not hang.working_on_cpu
    resident = probe.HangEvidence("x", gpu="0 %, 1 MiB, 2 MiB", cpu_used=10.2, probed=10.0, kernels=["k()"])
    assert not resident.working_on_cpu  # a resident kernel at 0 % still rules nothing out
    asleep = probe.HangEvidence("x", gpu="0 %, 11269 MiB, 143771 MiB", cpu_used=0.1, probed=10.0)
    assert not asleep.working_on_cpu  # a deadlock sleeps
    assert not probe.HangEvidence("x", gpu="0 %, 1 MiB, 2 MiB").working_on_cpu  # nothing measured: no claim
    assert not probe.HangEvidence("x", gpu="", cpu_used=2.0, probed=2.0).working_on_cpu  # no nvidia-smi
    # on a loaded host a busy process gets part of a CPU and waits for the rest: it still wanted the CPU
    loaded = probe.HangEvidence("x", gpu="0 %, 1 MiB, 2 MiB", cpu_used=0.8, waited=1.1, probed=2.0)
    assert loaded.working_on_cpu and not probe.HangEvidence("x", gpu="0 %, 1 MiB, 2 MiB", cpu_used=0.8,
                                                            waited=0.0, probed=2.0).working_on_cpu
