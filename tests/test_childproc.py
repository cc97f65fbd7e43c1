"""childproc.py: deadlines, bounded output, whole process trees ended, interrupts.

Every child here is a real program (tiny Python or shell scripts) that hangs,
floods, forks grandchildren that daemonize or call setsid, or prints bytes that
are not UTF-8.  "Nothing of ours left" is checked in /proc: every child carries
a marker in its environment, and no live process may still carry it afterwards.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from dsv4patch import childproc
from dsv4patch.errors import EXIT_CHILD, EXIT_INTERRUPTED, ChildError, Interrupted

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and the subreaper are Linux")


def marked() -> tuple[str, dict[str, str]]:
    mark = uuid.uuid4().hex
    return mark, {**os.environ, "DSV4PATCH_TEST_MARK": mark}


def carriers(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment carries ``mark``."""
    found = []
    needle = f"DSV4PATCH_TEST_MARK={mark}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X"):
            found.append(int(name))
    return found


def gone(mark: str, within: float = 2.0) -> bool:
    end = time.monotonic() + within
    while carriers(mark):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def script(body: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(body)]


def test_a_normal_child_gives_its_status_and_bounded_tails(tmp_path):
    fin = childproc.run(script("""
        import sys
        sys.stdout.write("x" * 100000 + "END-OUT\\n")
        sys.stderr.buffer.write(b"bad \\xff\\xfe bytes\\n")
        sys.exit(3)
    """), deadline=30, what="a script", keep=1000)
    assert fin.returncode == 3 and not fin.ok and fin.killed_by_signal is None
    assert fin.stdout.endswith("END-OUT\n") and len(fin.stdout) <= 1000
    assert fin.stdout_bytes == 100008
    assert "bad \ufffd\ufffd bytes" in fin.stderr  # tolerant decoding, no UnicodeDecodeError
    assert fin.status() == "exit 3"


def test_a_child_killed_by_a_signal_is_reported_as_such():
    fin = childproc.run(script("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), deadline=30, what="crash")
    assert fin.returncode is None and fin.killed_by_signal == signal.SIGSEGV
    assert fin.status() == "killed by SIGSEGV"


@linux_only
def test_a_hanging_child_and_its_grandchildren_end_at_the_deadline():
    mark, env = marked()
    t0 = time.monotonic()
    with pytest.raises(ChildError) as err:
        childproc.run(["sh", "-c", "sleep 300 & sleep 300"], deadline=1.0, what="a hang", env=env)
    assert time.monotonic() - t0 < 10
    assert err.value.exit_code == EXIT_CHILD == 8
    assert "did not finish within 1 s" in str(err.value)
    assert gone(mark), carriers(mark)


@linux_only
@pytest.mark.parametrize("shape", [
    "setsid sleep 300 &",  # a grandchild in its own session
    "(setsid sh -c 'sleep 300 & sleep 300' &) ; sleep 0.2;",  # double fork: re-parented to us (subreaper)
    "nohup sleep 300 >/dev/null 2>&1 &",  # survives SIGHUP, same session
    "(trap '' TERM INT HUP; exec sleep 300) &",  # ignores the polite signals
])
def test_grandchildren_are_ended_when_the_child_exits_normally(shape):
    mark, env = marked()
    fin = childproc.run(["sh", "-c", shape + " echo started"], deadline=30, what="a forker", env=env)
    assert fin.returncode == 0 and "started" in fin.stdout
    assert gone(mark), carriers(mark)


@linux_only
def test_a_daemon_that_double_forks_late_is_still_found():
    """The grandchild becomes a daemon after the child has exited: the child's session finds it."""
    mark, env = marked()
    body = "(sleep 0.5; setsid sh -c 'sleep 300' &) & echo started"
    fin = childproc.run(["sh", "-c", body], deadline=30, what="late daemon", env=env)
    assert fin.returncode == 0
    time.sleep(1.0)
    childproc.end_all()  # what main does on exit; the intermediate was already killed by run()
    assert gone(mark), carriers(mark)


def test_a_flood_is_cut_at_its_limit_and_memory_stays_bounded(tmp_path):
    """A child printing 1 GiB: dsv4patch's memory stays small (measured in a separate process)."""
    probe = tmp_path / "probe.py"
    probe.write_text(textwrap.dedent(f"""
        import json, re, sys
        sys.path.insert(0, {str(ROOT)!r})
        from dsv4patch import childproc
        flood = [sys.executable, "-c", "import os\\nb = b'\\\\xff' * (1 << 20)\\nfor _ in range(1024): os.write(1, b)"]
        out = {{}}
        fin = childproc.run(flood, deadline=120, what="unbounded", output=__import__("pathlib").Path(sys.argv[1]),
                            output_cap=4 << 20)
        out["bytes"] = fin.stdout_bytes
        out["dropped"] = fin.dropped
        out["tail"] = len(fin.stdout)
        try:
            childproc.run(flood, deadline=120, what="probe", flood=8 << 20)
        except childproc.ChildError as exc:
            out["flood"] = str(exc)
        # this process's own peak (VmHWM): ru_maxrss would also count the pytest worker's memory at the
        # fork, which exec carries over (a 170 MB worker failed CI here with a 16 MB probe)
        out["maxrss_kib"] = int(re.search(r"VmHWM:\\s*(\\d+)", open("/proc/self/status").read()).group(1))
        print(json.dumps(out))
    """))
    log = tmp_path / "out.log"
    res = subprocess.run([PY, str(probe), str(log)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["bytes"] == 1 << 30
    assert out["dropped"] == (1 << 30) - (4 << 20)
    assert out["tail"] <= childproc.KEEP
    assert "printed more than 8388608 bytes" in out["flood"]
    assert out["maxrss_kib"] < 64 * 1024, out  # 1 GiB went through; under 64 MiB stayed (about 16 here)
    assert (4 << 20) <= log.stat().st_size < (4 << 20) + 200
    assert b"bytes of output after the first" in log.read_bytes()[-200:]


def test_deadlines_must_be_finite_and_positive():
    for bad in (math.inf, math.nan, 0, -1):
        with pytest.raises(ValueError):
            childproc.run(["true"], deadline=bad, what="x")


def test_a_program_that_cannot_start_is_a_child_error(tmp_path):
    for argv0 in (str(tmp_path / "missing"), str(tmp_path)):
        with pytest.raises(ChildError) as err:
            childproc.run([argv0], deadline=5, what="--python")
        assert err.value.start_failed
    notexec = tmp_path / "notexec"
    notexec.write_text("#!/bin/sh\n")
    with pytest.raises(ChildError):
        childproc.run([str(notexec)], deadline=5, what="x")


def test_the_output_file_is_new_a_planted_link_is_replaced(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "out.log"
    out.symlink_to(victim)
    childproc.run(["echo", "hello"], deadline=10, what="echo", output=out)
    assert victim.read_text() == "keep me\n"
    assert not out.is_symlink() and out.read_text() == "hello\n"


@linux_only
def test_a_watched_child(tmp_path):
    """The self-test's use: start, watch, a hang probe by signal, the log's tail, the whole tree killed."""
    mark, env = marked()
    log = tmp_path / "engine.log"
    body = """
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGUSR1, lambda *a: print("STACKS DUMPED", flush=True))
        subprocess.Popen(["sleep", "300"])                       # a worker
        subprocess.Popen(["sh", "-c", "setsid sleep 300 &"])     # a daemon in its own session
        for i in range(100000):
            print("line", i, flush=i % 1000 == 0)
        print("READY", flush=True)
        time.sleep(300)
    """
    with childproc.Child(script(body), what="engine", log=log, env=env) as child:
        assert child.pid > 0
        end = time.monotonic() + 60
        while "READY" not in child.tail(200):
            assert time.monotonic() < end and child.poll() is None
            time.sleep(0.05)
        assert child.send_signal(signal.SIGUSR1)
        end = time.monotonic() + 30
        while "STACKS DUMPED" not in child.tail(200):
            assert time.monotonic() < end
            time.sleep(0.05)
        assert len(child.tail(100)) <= 100
        assert not child.wait(0.1)
        child.kill_tree()
        assert child.wait(10)
        assert gone(mark), carriers(mark)
    fin = child.finish()
    assert fin.killed_by_signal == signal.SIGKILL and fin.output == log
    assert "line 99999" in log.read_text()


def test_a_watched_childs_log_is_capped(tmp_path):
    log = tmp_path / "big.log"
    with childproc.Child(script("import os\nfor _ in range(64): os.write(1, b'x' * (1 << 20))"),
                         what="chatty", log=log, log_cap=1 << 20) as child:
        assert child.wait(60)
    fin = child.finish()
    assert fin.returncode == 0 and fin.stdout_bytes == 64 << 20 and fin.dropped == 63 << 20
    assert log.stat().st_size < (1 << 20) + 200


INTERRUPTED_RUNNER = """
import os, sys, threading, time
sys.path.insert(0, {root!r})
from dsv4patch import childproc
from dsv4patch.errors import Interrupted
results = []

def worker():
    try:
        results.append(childproc.run(["sh", "-c", "sleep 300 & sleep 300"], deadline=600, what="w"))
    except BaseException as exc:
        results.append(type(exc).__name__)

with childproc.interrupts():
    try:
        t = threading.Thread(target=worker)
        t.start()
        print("STARTED", flush=True)
        childproc.run(["sh", "-c", "(setsid sleep 300 &); sleep 300"], deadline=600, what="main")
        print("NOT INTERRUPTED", flush=True)
    except Interrupted as exc:
        t.join(30)
        print("INTERRUPTED", exc.signum, results, flush=True)
"""


@linux_only
@pytest.mark.parametrize("how", ["INT-group", "TERM-process", "HUP-process", "INT-process"])
def test_an_interrupt_ends_every_child_and_every_waiting_thread_raises(tmp_path, how):
    mark, env = marked()
    sig, target = how.split("-")
    proc = subprocess.Popen([PY, "-c", INTERRUPTED_RUNNER.format(root=str(ROOT))], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "STARTED"
    time.sleep(0.5)
    signum = getattr(signal, f"SIG{sig}")
    if target == "group":
        os.killpg(proc.pid, signum)
    else:
        os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=60)
    assert out.strip() == f"INTERRUPTED {int(signum)} ['Interrupted']", (out, err)
    assert gone(mark), carriers(mark)


def test_an_interrupt_is_never_a_result():
    """run() never returns a Finished for a child killed by an interrupt."""
    with childproc.interrupts():
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):  # the handler raises at the next bytecode at the latest
                time.sleep(0.01)
        assert childproc.interrupted()
        with pytest.raises(Interrupted):
            childproc.run(["true"], deadline=5, what="after")
    with childproc.interrupts():  # the next run starts clean
        assert not childproc.interrupted()


def test_an_interrupt_once_the_result_is_in_place_does_not_end_the_run(tmp_path):
    """finishing(): a signal inside the block waits for it (the rename happens), after it the run is
    finishing: signals are recorded and end child trees, never raised; the next run starts clean.
    Before the block, a signal still ends the run."""
    with childproc.interrupts():
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100):
                time.sleep(0.01)
    placed = tmp_path / "result"
    with childproc.interrupts():
        with childproc.finishing():
            os.kill(os.getpid(), signal.SIGINT)  # arrives inside the block: deferred
            for _ in range(20):
                time.sleep(0.01)
            placed.write_text("in place")
        for sig in (signal.SIGTERM, signal.SIGINT):  # after it: recorded, not raised
            os.kill(os.getpid(), sig)
            for _ in range(20):
                time.sleep(0.01)
        assert placed.read_text() == "in place" and childproc.interrupted()
    with childproc.interrupts():
        assert not childproc.interrupted()
        with pytest.raises(Interrupted):  # finishing ended with its run
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):
                time.sleep(0.01)


def test_an_interrupt_never_cuts_an_uninterrupted_block_in_two(tmp_path):
    """uninterrupted(): a signal inside waits for the block (both files are written), then is raised."""
    first, second = tmp_path / "variant.patch", tmp_path / "vllm.toml"
    with childproc.interrupts():
        with pytest.raises(Interrupted):
            with childproc.uninterrupted():
                first.write_text("a")
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(20):
                    time.sleep(0.01)
                second.write_text("b")
            raise AssertionError("not raised once the block was over")
    assert first.read_text() == "a" and second.read_text() == "b"


def test_an_interrupt_does_not_outlive_its_run(tmp_path):
    """A command run in-process (a library, a test) that was interrupted leaves nothing behind: after its
    block no interrupt is seen, and a git that exits non-zero afterwards (a merge with conflicts) is a
    result, not an interrupt.  (A CI worker ran this module, then test_git's conflicting merge raised
    Interrupted: the interrupt the last test here sent itself had outlived its run.)"""
    from dsv4patch import git, guard

    repo = tmp_path / "r"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        with childproc.interrupts():
            with pytest.raises(Interrupted):
                os.kill(os.getpid(), sig)
                for _ in range(100):
                    time.sleep(0.01)
        assert not childproc.interrupted() and childproc.interrupt_signal() is None
        with guard.owned(repo):  # a repository of the test's own, as test_git's
            merged = git.merge_file(repo, b"a\nX\nc\n", b"a\nb\nc\n", b"a\nY\nc\n")
        assert not merged.clean and b"<<<<<<<" in merged.text


FORKED_CHILD_SIGNAL = """
import os, signal, subprocess, sys, threading
from dsv4patch import childproc

def to_itself():  # a signal to the group that lands between fork and exec
    os.kill(os.getpid(), signal.SIGTERM)

held, release = threading.Event(), threading.Event()

def holder():
    with childproc._STATE.lock:
        held.set()
        release.wait()

with childproc.interrupts():
    rc1 = subprocess.Popen([sys.executable, "-c", "pass"], preexec_fn=to_itself).wait()
    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    try:  # another thread holds the run's lock as the process forks (as a worker's tracking may)
        rc2 = subprocess.Popen([sys.executable, "-c", "pass"], preexec_fn=to_itself).wait()
    finally:
        release.set()
        t.join()
    print(rc1, rc2)
"""


def test_a_signal_in_a_forked_child_before_exec_is_not_the_runs():
    """CI's random SIGTERM to apply's group once landed in a git child between fork and exec, where
    subprocess runs Python (its after-fork hooks): the run's handler raised Interrupted there and its
    traceback went to the run's stderr ("Exception ignored in: <function _after_fork>").  In a forked
    child the handler does nothing (no raise, no signal to the run's children, not the run's lock,
    which a thread of the run may hold as it forks): the child execs and runs.  (The run itself got
    the group's signal too and handles it; here, where only the child got one, the run still reads it
    from the wakeup pipe the child shares until exec: ``interrupted()`` says so, which is not checked.)"""
    res = subprocess.run([sys.executable, "-c", FORKED_CHILD_SIGNAL], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["0", "0"], (res.stdout, res.stderr[-3000:])
    assert "Interrupted" not in res.stderr and "Exception ignored" not in res.stderr, res.stderr[-3000:]


def test_the_cli_exit_code_is_documented():
    from dsv4patch.main import EPILOG

    assert f"  {EXIT_CHILD}    " in EPILOG and f"  {EXIT_INTERRUPTED}  " in EPILOG
