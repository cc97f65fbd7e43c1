"""What a hung engine was doing when its deadline passed: the evidence a user can send us.

Why more than one source: the H200 run of 2026-12-03 sent SIGUSR1 to a hung
engine and got its header and no stacks.  So the child itself arms
faulthandler's watchdog thread before each stage's deadline (:mod:`.child`:
it dumps every thread's Python stack without the main thread's help and
without a signal handler), and here, before the engine's process tree is
killed, the parent adds what it can read from outside:

* the process as the kernel sees it (``/proc``): its state and each
  thread's state and wait channel, its CPU time twice (a spinning
  synchronize burns CPU; a thread in uninterruptible sleep does not, and
  takes no signal), the machine's memory, I/O and CPU pressure, free disk;
* SIGUSR1 again (faulthandler, into the same stacks file), waiting up to
  ten seconds for the dump to appear;
* ``py-spy dump --native`` of the engine process, when ``py-spy`` is on PATH:
  Python and native frames of every thread (a thread blocked in
  ``cudaStreamSynchronize`` shows as such);
* ``nvidia-smi``: the GPU's utilization and memory, and the compute processes
  (a spinning kernel keeps the GPU at 100 % with no progress);
* ``cuda-gdb -p PID -batch -ex 'info cuda kernels'``, when cuda-gdb is on
  PATH: the kernels resident on the GPU, by name (a top-k kernel that never
  retires names itself).

Each is a child of its own under a short deadline (:mod:`dsv4patch.childproc`),
so a probe that hangs costs seconds, never the run.  Everything goes into
``ENGINE.probe.txt`` beside the engine's log; the report carries a summary:
the stage, the last line vLLM logged, where the main thread was, the GPU's
utilization and the kernels seen.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4patch import childproc
from dsv4patch.errors import ChildError

STACKS_LIMIT = 4 << 20  # bytes of a stacks file read back for the summary
# Seconds the hung process is watched at least (its CPU time read before and after, the SIGUSR1 dump awaited):
# HangEvidence.working_on_cpu needs a sample of 1 s or more.
SAMPLE_SECONDS = 2.0
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# cuda-gdb's "info cuda kernels" row: ... Status SMs-mask (grid) (block) Invocation
_KERNEL_ROW = re.compile(r"\(\d+,\d+,\d+\)\s+\(\d+,\d+,\d+\)\s+(?P<invocation>\S.*)$")


@dataclass
class HangEvidence:
    """The summary of what the probes found (the full text is in ``file``)."""

    file: str
    main_frames: list[str] = field(default_factory=list)  # innermost first: "func (file:line)"
    gpu: str = ""  # nvidia-smi's utilization and memory line
    kernels: list[str] = field(default_factory=list)  # cuda-gdb's resident kernels
    tools: dict[str, str] = field(default_factory=dict)  # each probe: "ok", "absent" or why it failed
    process: str = ""  # /proc: state, threads by state, CPU seconds used while probed
    compiler: str = ""  # the JIT compiler the main thread was in, if any (TileLang, CuTe DSL, Triton, ...)
    cpu_used: float | None = None  # CPU seconds the process used while it was probed (all threads)
    waited: float | None = None  # seconds its threads were ready to run but waited for a CPU (a loaded host)
    probed: float | None = None  # over how many seconds of wall time

    @property
    def gpu_idle(self) -> bool:
        """The GPU did nothing: utilization 0 % and no kernel of ours resident (a hung kernel keeps it busy)."""
        return self.gpu.startswith("0 %") and not self.kernels

    @property
    def still_compiling(self) -> bool:
        """Not a hang: the engine was compiling kernels on an idle GPU when its deadline passed (a cold node)."""
        return bool(self.compiler) and self.gpu_idle

    @property
    def working_on_cpu(self) -> bool:
        """The process ran on the CPU for at least half the time it was probed, on an idle GPU: busy, not stuck.

        A kernel that never retires keeps the GPU at 100 % (and may keep a host thread spinning beside it);
        a deadlock sleeps.  What is left is work on the host: at engine start, vLLM's CUDA-graph capture
        collecting garbage before each graph (``breakable_cudagraph.py``'s ``gc.collect()``, measured on the
        H200 with five engines starting at once), a compile in a frame no compiler name matches.
        """
        if not self.gpu_idle or self.cpu_used is None or self.probed is None or self.probed < 1.0:
            return False
        return self.cpu_used + (self.waited or 0.0) >= 0.5 * self.probed

    def describe(self) -> str:
        parts = []
        if self.process:
            parts.append(self.process)
        if self.main_frames:
            parts.append("main thread in " + " <- ".join(self.main_frames[:3]))
        if self.gpu:
            parts.append(f"GPU {self.gpu}")
        if self.kernels:
            parts.append("kernels on the GPU: " + ", ".join(self.kernels[:4]))
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "main_frames": self.main_frames, "gpu": self.gpu or None,
                "kernels": self.kernels, "tools": self.tools, "process": self.process or None,
                "compiler": self.compiler or None, "cpu_used": self.cpu_used, "waited": self.waited,
                "probed": self.probed}


def _small(path: str, limit: int = 64 << 10) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, limit).decode("utf-8", errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of PID (all its threads), from /proc/PID/stat."""
    stat = _small(f"/proc/{pid}/stat")
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return None


def _task_ids(pid: int) -> list[str]:
    """PID's threads (/proc/PID/task), oldest first, at most 512; none when the process is gone."""
    try:
        return sorted(os.listdir(f"/proc/{pid}/task"), key=int)[:512]
    except (OSError, ValueError):
        return []


def waited_seconds(pid: int) -> float | None:
    """Seconds PID's threads have spent ready to run but waiting for a CPU (/proc/PID/task/*/schedstat, second
    field), or None where the kernel keeps no such count.  On a loaded host a busy process gets only part of a
    CPU: its CPU time plus this wait is what it wanted."""
    total, seen = 0, False
    for tid in _task_ids(pid):
        fields = _small(f"/proc/{pid}/task/{tid}/schedstat", 256).split()
        if len(fields) >= 2 and fields[1].isdigit():
            total, seen = total + int(fields[1]), True
    return total / 1e9 if seen else None


def process_report(pid: int) -> tuple[str, str]:
    """(a one-line summary, the full text): the process's state, its threads' states and wait channels."""
    status = _small(f"/proc/{pid}/status")
    state = next((ln.split(":", 1)[1].strip() for ln in status.splitlines() if ln.startswith("State:")), "gone")
    threads: dict[str, int] = {}
    rows = []
    for tid in _task_ids(pid):
        st = _small(f"/proc/{pid}/task/{tid}/stat")
        tstate = st[st.rfind(")") + 2:].split()[0] if ")" in st else "?"
        comm = _small(f"/proc/{pid}/task/{tid}/comm").strip()
        wchan = _small(f"/proc/{pid}/task/{tid}/wchan").strip()
        threads[tstate] = threads.get(tstate, 0) + 1
        rows.append(f"  {tid} {comm:<16} {tstate} {wchan}")
    summary = f"process {state}, threads " + ", ".join(f"{n} {k}" for k, n in sorted(threads.items()))
    text = (f"{status}\n" + "\n".join(rows) + "\n\n" + "".join(
        f"--- /proc/pressure/{k}\n{_small(f'/proc/pressure/{k}')}" for k in ("cpu", "memory", "io"))
        + "--- /proc/meminfo (first lines)\n" + "\n".join(_small("/proc/meminfo").splitlines()[:8]) + "\n")
    return summary, text


def read_tail(path: Path, limit: int) -> str:
    """The last LIMIT bytes of a file we wrote (no links followed), decoded leniently."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(limit, size), max(0, size - limit))
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")


def _main_block(stacks: str) -> list[tuple[str, str, str]]:
    """(func, file, line) of the main thread's frames, innermost first, in the last faulthandler dump.

    faulthandler lists threads newest first, so the main thread (the oldest)
    is the last block of a dump; a SIGUSR1 dump names it "Current thread".
    """
    blocks: list[list[tuple[str, str, str]]] = []
    for line in stacks.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
        elif blocks and (m := _FRAME.match(line)):
            blocks[-1].append((m["func"], m["file"], m["line"]))
    for block in reversed(blocks):
        if block:
            return block
    return []


def main_thread_frames(stacks: str) -> list[str]:
    """The main thread's frames (innermost first) of the last faulthandler dump in STACKS, as
    ``func (file.py:line)``."""
    return [f"{func} ({Path(file).name}:{line})" for func, file, line in _main_block(stacks)]


# Where a thread that compiles kernels is: a JIT compiler's package (a fragment of the frame's path as
# faulthandler prints it) and, where the package also runs kernels, the function that compiles.  Triton's
# ``_init_handles`` is not compiling: it loads a module, and waits there while a hung kernel holds the GPU.
COMPILERS: tuple[tuple[str, str | None, str], ...] = (
    ("tilelang/", None, "TileLang"), ("/tvm/", None, "TVM"), ("tvm_ffi/", None, "TVM"),
    ("cutlass/base_dsl/", None, "CuTe DSL"), ("cutlass/cutlass_dsl/", None, "CuTe DSL"),
    ("flashinfer/jit/", None, "FlashInfer JIT"), ("deep_gemm/jit", None, "DeepGEMM JIT"),
    ("torch/_inductor/", None, "torch inductor"), ("triton/compiler/compiler.py", "compile", "Triton"),
)


def compiling(stacks: str) -> str:
    """Which JIT compiler the main thread of the last dump was in (its innermost such frame), or ""."""
    for func, file, line in _main_block(stacks):
        path = file.replace("\\", "/")
        for fragment, function, name in COMPILERS:
            if fragment in path and function in (None, func):
                return f"{name}: {func} ({'/'.join(Path(path).parts[-3:])}:{line})"
    return ""


def kernel_names(cuda_gdb_output: str) -> list[str]:
    """The kernels cuda-gdb lists as resident (``info cuda kernels``), by their invocation, at most eight."""
    names = []
    for line in cuda_gdb_output.splitlines():
        m = _KERNEL_ROW.search(line)
        if m and m["invocation"][:160] not in names:
            names.append(m["invocation"][:160])
    return names[:8]


def last_log_line(log_tail: str) -> str:
    """The last thing the engine logged that says where it was (vLLM's INFO/WARNING lines, errors)."""
    keys = (" INFO ", " WARNING ", "WARNING ", "INFO ", "Error", "error", "Compil", "Captur", "Warming")
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip() and "\r" not in ln]
    picked = [ln for ln in lines if any(k in ln for k in keys)]
    return ((picked or lines or [""])[-1])[:300]


def _tool(argv: list[str], what: str, deadline: float) -> tuple[str, str]:
    """Run one probe tool; (its output, "ok" / why not)."""
    if shutil.which(argv[0]) is None:
        return "", "absent"
    try:
        fin = childproc.run(argv, deadline=deadline, what=what, merge=True, keep=256 << 10, check_bounds=False)
    except ChildError as exc:
        return "", f"could not run: {exc}"
    state = "ok" if fin.returncode == 0 else fin.status()
    return fin.text, state


def collect(child: childproc.Child, *, stacks: Path, out: Path, tool_deadline: float = 40.0) -> HangEvidence:
    """Probe the hung engine CHILD (still running) and write everything to OUT; the summary."""
    ev = HangEvidence(str(out))
    sections: list[str] = []
    pid_n = child.pid
    cpu0, wait0, t0 = cpu_seconds(pid_n), waited_seconds(pid_n), time.monotonic()
    summary, text = process_report(pid_n)
    sections.append(f"===== /proc/{pid_n} =====\n{text}")
    before = stacks.stat().st_size if stacks.exists() else 0
    sent = child.send_signal(signal.SIGUSR1)
    ev.tools["faulthandler"] = "ok" if sent else "the engine had already exited"
    while sent and time.monotonic() - t0 < 10.0:
        time.sleep(0.1)
        if stacks.exists() and stacks.stat().st_size > before and time.monotonic() - t0 >= SAMPLE_SECONDS:
            break
    if sent and not (stacks.exists() and stacks.stat().st_size > before):
        ev.tools["faulthandler"] = "no dump within 10 s (a thread in uninterruptible sleep takes no signal)"
    cpu1, wait1, spent = cpu_seconds(pid_n), waited_seconds(pid_n), time.monotonic() - t0
    if cpu0 is not None and cpu1 is not None:
        ev.cpu_used, ev.probed = round(cpu1 - cpu0, 2), round(spent, 2)
    if wait0 is not None and wait1 is not None:
        ev.waited = round(max(0.0, wait1 - wait0), 2)
    used = "" if ev.cpu_used is None else (
        f"{ev.cpu_used:.1f} CPU s" + (f" (+{ev.waited:.1f} s waiting for a CPU)" if ev.waited else "") + f" in {spent:.0f} s")
    ev.process = summary + (f", {used}" if used else "")
    try:
        usage = shutil.disk_usage(out.parent)
        sections.append(f"===== disk: {usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f} =====")
    except OSError:
        pass
    pid = str(pid_n)
    text, ev.tools["py-spy"] = _tool(["py-spy", "dump", "--native", "--pid", pid], "py-spy dump",
                                     min(tool_deadline, 30.0))
    sections.append(f"===== py-spy dump --native --pid {pid}: {ev.tools['py-spy']} =====\n{text}")
    text, ev.tools["nvidia-smi"] = _tool(
        ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,memory.total", "--format=csv,noheader"],
        "nvidia-smi", 20.0)
    ev.gpu = text.strip().splitlines()[-1][:200] if text.strip() else ""
    apps, _ = _tool(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                    "nvidia-smi", 20.0)
    sections.append(f"===== nvidia-smi: {ev.tools['nvidia-smi']} =====\n{text}\n{apps}")
    text, ev.tools["cuda-gdb"] = _tool(["cuda-gdb", "-p", pid, "-batch", "-ex", "info cuda kernels",
                                        "-ex", "detach"], "cuda-gdb", tool_deadline)
    sections.append(f"===== cuda-gdb -p {pid} info cuda kernels: {ev.tools['cuda-gdb']} =====\n{text}")
    ev.kernels = kernel_names(text)
    dumped = read_tail(stacks, STACKS_LIMIT)
    ev.main_frames = main_thread_frames(dumped)
    ev.compiler = compiling(dumped)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
        fh.write("\n\n".join(sections) + "\n")
    return ev
