"""The one way dsv4patch runs a child program (git aside): a deadline, bounded output, the whole tree ended.

Why: every program dsv4patch starts is named by someone it does not control
(``--nvcc``, ``--python``, ``CUDA_HOME``, ``PATH``) or runs code it does not
control (pytest on a patched tree, pip, a self-test engine).  Started with a
bare :mod:`subprocess` call, such a child can hang the command forever, grow it
to any size by printing without end (``capture_output=True`` keeps all of it),
kill it with a ``UnicodeDecodeError`` (``text=True``), or leave grandchildren
running after dsv4patch has exited.  Here every child gets:

* **a deadline** (seconds, finite and > 0): past it the whole tree is killed
  and :func:`run` raises :class:`~dsv4patch.errors.ChildError` (exit 8);
* **bounded output**: at most ``keep`` bytes of each stream's *end* are kept in
  memory (decoded with ``errors="replace"``: any bytes are fine); the rest can
  be streamed to a file (``output``), itself capped at ``output_cap`` bytes
  (what comes after the cap is counted and dropped, and the file says so); a
  ``flood`` limit kills a child that prints more than it may (a probe answers
  in a few lines);
* **its own session and process group**, and on Linux this process made a
  *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): a grandchild that
  daemonizes or calls ``setsid`` is re-parented to dsv4patch, not to init, so
  it can still be found.  When the child ends (by itself, at the deadline, on
  an interrupt, or when dsv4patch exits) every process of its tree is killed:
  its group, every process of its session, every descendant (``/proc``), and
  every orphan it left that was handed to us.  The direct child also gets
  ``PR_SET_PDEATHSIG`` (SIGKILL): if dsv4patch itself is killed with SIGKILL it
  does not run on.  Elsewhere (macOS) there is no subreaper and no ``/proc``:
  the child's process group is killed, which ends every grandchild that did
  not leave it;
* **interrupts** (:func:`interrupts`, installed by ``main``): SIGINT, SIGTERM
  and SIGHUP, to the process or its group, on a terminal or not, raise
  :class:`~dsv4patch.errors.Interrupted` in the main thread, kill every live
  child tree at once, and make any thread waiting on a child raise
  ``Interrupted`` too: a child killed by the signal is never read as a
  failure, a conflict or any other result (``git.py`` asks
  :func:`interrupted` for the same reason).

API
---
``run(argv, *, deadline, what, cwd=None, env=None, stdin=None, output=None, merge=False,
keep=KEEP, output_cap=OUTPUT_CAP, flood=None, check_bounds=True, on_chunk=None) -> Finished``
    Run to the end.  Returns a :class:`Finished` (exit status or the signal that
    ended it, bounded tails of stdout and stderr, byte counts, the output file);
    ``merge`` puts stderr into stdout, ``on_chunk`` is called with each piece of
    stdout as it is read (an output too large to keep, parsed as it streams);
    a non-zero exit is a result for the caller to judge.  Raises
    :class:`~dsv4patch.errors.ChildError` when the program cannot be started,
    or (``check_bounds``) ran past its deadline or its ``flood`` limit;
    :class:`~dsv4patch.errors.Interrupted` when dsv4patch was interrupted
    meanwhile.

``Child(argv, *, what, log, cwd=None, env=None, stdin=None, log_cap=LOG_CAP)``
    A child the caller watches (self-test engines, long pytest sessions).  A
    context manager: ``with Child(...) as c:`` starts it; ``c.pid``,
    ``c.poll()`` (exit status or None), ``c.send_signal(SIGUSR1)`` (e.g. a hang
    probe: to the child itself, or ``group=True``), ``c.wait(timeout) -> bool``,
    ``c.kill_tree()``, ``c.tail(n)`` (the last ``n`` bytes of its log, decoded),
    ``c.finish() -> Finished``.  stdout and stderr go, merged, to ``log`` (a new
    file: a link or file planted at that name is replaced, never written
    through), capped at ``log_cap`` bytes; leaving the ``with`` block kills
    whatever is left of the tree.  Start it and wait for it in a thread that
    outlives it (the parent-death signal is tied to the starting thread).

``interrupts(*, exiting=False, early=())``
    A context manager for ``main``: installs the signal handlers (main thread
    only; elsewhere it only tracks), always, even for a SIGINT inherited as
    ignored; on leaving ends every child tree still running and every orphan a
    child left.  ``early``: signals the entry point recorded before (raised at
    once); ``exiting``: late signals are recorded, not raised, once the block is
    left.  ``interrupted()`` says (from any thread, at once: the C-level handler
    writes the wake-up pipe) whether an interrupt arrived; ``raise_if_interrupted()``.
    ``finishing()``: the block that puts the run's result in place; an interrupt
    after it no longer ends the run, which reports its result.  ``uninterrupted()``:
    a block an interrupt never cuts (raised once it is over); ``starting()``: the same, for the block
    that starts a child program this module does not track (``git.py``'s).

``end_tree(pid)``, ``end_all()``
    Kill one tree / every tree this process started (also done on exit).

``ask_python(python, code, *args, marker, label) -> (Finished, answer)``
    Run ``python -c code args`` (a probe of an interpreter the user named) under
    :data:`PROBE_DEADLINE` and :data:`PROBE_OUTPUT`; the JSON on its
    ``marker`` line, parsed bounded (:func:`dsv4patch.safeio.loads_json`), or
    None when there is none.  An interpreter that cannot be started or answers
    something that is not JSON is a usage error (exit 2); one that hangs or
    floods a :class:`~dsv4patch.errors.ChildError` (exit 8).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

from dsv4patch.errors import ChildError as ChildError  # re-exported: the error callers catch
from dsv4patch.errors import Interrupted as Interrupted
from dsv4patch.errors import ParameterError
from dsv4patch.records import frozen

# Bounds (docs/trust.md "Bounds"): what one child may cost dsv4patch.
KEEP = 64 << 10  # bytes of the end of each stream kept in memory (messages quote its last lines)
OUTPUT_CAP = 64 << 20  # bytes of a child's output written to its output file; the rest is counted, dropped
LOG_CAP = 256 << 20  # the same for a watched child's log (a self-test engine's log)
PROBE_DEADLINE = 120.0  # seconds a probe of a program the user named may take (``--python``, ``nvcc --version``)
PROBE_OUTPUT = 1 << 20  # bytes such a probe may print before it is ended as a flood
_READ = 1 << 16
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_LINUX = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


# ---------------------------------------------------------------------------
# Interrupt state


class _State:
    """What every thread must see at once: an interrupt arrived (and which), the live children."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.signal: int | None = None
        self.wakeup_r: int | None = None  # the read end of signal.set_wakeup_fd's pipe
        self.children: dict[int, _Tracked] = {}
        self.subreaper = False
        self.first_start: int | None = None  # start time (clock ticks) of the first child of this run
        self.raised = False  # the main thread has raised Interrupted for this run
        self.critical = 0  # > 0: the main thread is starting a child; Interrupted waits until it is tracked
        self.deferred = False
        self.finishing = False  # the run's result is in place (finishing()): an interrupt is not raised
        self.pid = os.getpid()  # the process whose handlers these are (interrupts() sets it)


_STATE = _State()


def interrupted(grace: float = 0.0) -> bool:
    """Has an interrupt signal arrived (from any thread; waits up to ``grace`` s for one)?

    The C-level signal handler writes the signal number into the wake-up pipe
    before any Python code runs, so a worker thread that sees its child die of
    a group SIGINT finds the interrupt here even before the main thread has run
    the Python handler.
    """
    end = time.monotonic() + grace
    while True:
        with _STATE.lock:
            if _STATE.signal is None and _STATE.wakeup_r is not None:
                try:
                    data = os.read(_STATE.wakeup_r, 512)
                except (BlockingIOError, OSError):
                    data = b""
                for b in data:
                    if b in INTERRUPT_SIGNALS:
                        _STATE.signal = b
                        break
            if _STATE.signal is not None:
                return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)


def interrupt_signal() -> int | None:
    """The signal of the interrupt that arrived, or None."""
    return _STATE.signal if interrupted() else None


def raise_if_interrupted() -> None:
    if interrupted():
        raise Interrupted(_STATE.signal)


def _in_forked_child() -> bool:
    """A child between fork and exec (subprocess runs Python there: its after-fork hooks, a
    preexec_fn): a signal to the group that lands then is the child's, not the run's.  The handler
    must not raise in it (CI saw "Exception ignored in: <function _after_fork>" and the traceback
    of Interrupted on the run's stderr), signal the run's children or take the run's lock (held by
    another thread when the process forked, it is never released there)."""
    return os.getpid() != _STATE.pid


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _in_forked_child():
        return  # the run's own process handles it; the child execs and is ended with the run's children
    with _STATE.lock:
        _STATE.signal = _STATE.signal or signum
        first = not _STATE.raised
        if _STATE.critical:
            _STATE.deferred = True  # raised once the child being started is tracked (see _spawn)
            first = False
        elif _STATE.finishing:
            first = False  # the result is in place: the run reports it (see finishing)
        else:
            _STATE.raised = True
    _signal_children()
    if first:
        raise Interrupted(signum)
    # A second signal while unwinding is recorded, not raised: the cleanup (killing child
    # trees, removing temporary files) is bounded and finishes.


@contextlib.contextmanager
def _critical() -> Iterator[None]:
    """In the main thread: an interrupt inside waits until the block is done (then raises)."""
    main = threading.current_thread() is threading.main_thread()
    if main:
        with _STATE.lock:
            _STATE.critical += 1
    try:
        yield
    finally:
        if main:
            with _STATE.lock:
                _STATE.critical -= 1
                fire = _STATE.critical == 0 and _STATE.deferred and not _STATE.raised and not _STATE.finishing
                if fire:
                    _STATE.deferred = False
                    _STATE.raised = True
            if fire:
                _signal_children()
                raise Interrupted(_STATE.signal)


@contextlib.contextmanager
def starting() -> Iterator[None]:
    """In the main thread: the block that starts a child program the caller then owns (``git.py``'s
    Popen, which this module does not track); an interrupt that arrives inside is raised once the
    block is over.  Keep the child in a name bound inside the block and kill and reap it in the
    ``except`` around it: an interrupt raised between the fork and that ``try`` would otherwise leave
    the child running on behind the cleanup (a ``git clone`` re-creating the directory its caller
    had just removed)."""
    with _critical():
        yield


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """In the main thread: a block an interrupt never cuts in two (several files written as one
    change: a port's variants and lock entry); one that arrives inside is raised once the block is
    over.  Only for bounded work without child programs."""
    with _critical():
        yield


@contextlib.contextmanager
def finishing() -> Iterator[None]:
    """Put the run's result in place (the block: the rename of a finished output file).

    An interrupt that arrives inside waits for the block; once the block is done, the run is
    finishing: an interrupt still ends every child tree but is no longer raised, so the command
    reports the result it made (exit 0), never "interrupted" with its output already in place.
    What is left of the run is bounded (removing its work files, printing the result).  A block
    that fails raises its error (and a deferred interrupt, if one came).
    """
    with _critical():
        yield
        if threading.current_thread() is threading.main_thread():
            with _STATE.lock:
                _STATE.finishing = True


def _late_signal(signum: int, frame: FrameType | None) -> None:
    """After the command is over (``interrupts(exiting=True)``): recorded, not raised."""
    if _in_forked_child():
        return
    with _STATE.lock:
        _STATE.signal = _STATE.signal or signum


@contextlib.contextmanager
def interrupts(*, exiting: bool = False, early: Sequence[int] = ()) -> Iterator[None]:
    """Handle SIGINT/SIGTERM/SIGHUP for one command, and end every child tree when it is over.

    ``exiting``: the process exits right after (the CLI's entry point): a signal
    that arrives once the command is over no longer kills it, so a result it
    printed in full is not turned into a death by signal; otherwise the previous
    handlers come back.  ``early``: signals that arrived before (recorded by the
    entry point): raised as ``Interrupted`` at once, inside the block.
    """
    main_thread = threading.current_thread() is threading.main_thread()
    saved: dict[int, Any] = {}
    saved_fd = -1
    r = w = -1
    with _STATE.lock:
        _STATE.signal = None
        _STATE.first_start = None
        _STATE.raised = _STATE.deferred = _STATE.finishing = False
    if main_thread:
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        for fd in (r, w):
            os.set_inheritable(fd, False)
        _STATE.wakeup_r = r
        _STATE.pid = os.getpid()
        for sig in INTERRUPT_SIGNALS:
            saved[sig] = signal.signal(sig, _on_signal)
        saved_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    try:
        first = next((s for s in early if s in INTERRUPT_SIGNALS), None)
        if first is not None:
            with _STATE.lock:
                _STATE.signal = first
                _STATE.raised = True
            raise Interrupted(first)
        yield
    finally:
        try:
            end_all()
        finally:
            if main_thread:
                signal.set_wakeup_fd(saved_fd)
                for signum, handler in saved.items():
                    signal.signal(signum, _late_signal if exiting else handler)
                with _STATE.lock:
                    _STATE.wakeup_r = None
                os.close(r)
                os.close(w)
            if not exiting:  # the run's interrupt ends with it: what the process runs next never reads it
                with _STATE.lock:  # (a git that exits non-zero later, e.g. a merge with conflicts, is not "interrupted")
                    _STATE.signal = None
                    _STATE.raised = _STATE.deferred = _STATE.finishing = False


# ---------------------------------------------------------------------------
# Process trees


@frozen
class _Proc:
    ppid: int
    pgrp: int
    sid: int
    start: int  # clock ticks after boot
    zombie: bool


def _stat(pid: int) -> _Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return _Proc(int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]), fields[0] in (b"Z", b"X"))
    except (IndexError, ValueError):
        return None


def _procs() -> dict[int, _Proc]:
    out: dict[int, _Proc] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


def _prctl(option: int, value: int) -> bool:
    if not _LINUX:
        return False
    import ctypes

    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _ensure_subreaper() -> None:
    with _STATE.lock:
        if not _STATE.subreaper:
            _STATE.subreaper = _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _die_with_parent_fn() -> Any:
    """preexec_fn: SIGKILL for the child when the thread that started it dies (Linux)."""
    if not _LINUX:
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return die_with_parent


class _Tracked:
    """A live child: its Popen and its session (= its pid: it is the session leader)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid
        st = _stat(proc.pid) if _LINUX else None
        self.start = st.start if st is not None else 0
        self.killed_by_us = False


def _signal_children() -> None:
    """From the signal handler: SIGKILL every live child's group at once (the sweep comes later)."""
    with _STATE.lock:
        kids = list(_STATE.children.values())
    for t in kids:
        t.killed_by_us = True
        with contextlib.suppress(OSError):
            os.killpg(t.pid, signal.SIGKILL)


def _members(root: int, start: int, procs: dict[int, _Proc], others: set[int]) -> set[int]:
    """Every process of the tree of ``root`` (a session leader started at ``start``)."""
    me, my_sid = os.getpid(), os.getsid(0)
    found = {pid for pid, p in procs.items() if p.sid == root or p.pgrp == root}
    if root in procs:
        found.add(root)
    # Orphans handed to us (subreaper) that were born after the root: a daemon it left.
    other_sids = {o for o in others if o != root}
    for pid, p in procs.items():
        if (p.ppid == me and pid not in others and p.sid != my_sid and p.start >= start
                and p.sid not in other_sids):
            found.add(pid)
    # Descendants of all of those.
    changed = True
    while changed:
        changed = False
        for pid, p in procs.items():
            if pid not in found and p.ppid in found and p.ppid != me:
                found.add(pid)
                changed = True
    found.discard(me)
    return found


def end_tree(pid: int, start: int = 0, *, rounds: int = 100) -> None:
    """SIGKILL every process of the tree of the child ``pid`` until none is left (see the docstring).

    The child ``pid`` itself is not reaped here (its Popen does that); orphans
    handed to this process are.
    """
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    if not _LINUX:
        return
    me = os.getpid()
    for _ in range(rounds):
        procs = _procs()
        with _STATE.lock:
            others = set(_STATE.children)
        alive = False
        for m in sorted(_members(pid, start, procs, others)):
            p = procs[m]
            if m != pid and m in others:
                continue  # another live child of ours: its own tree
            if p.zombie:
                if m != pid and p.ppid == me:
                    with contextlib.suppress(OSError):
                        os.waitpid(m, os.WNOHANG)  # an orphan handed to us: reap it
                continue
            alive = True
            with contextlib.suppress(OSError):
                os.kill(m, signal.SIGKILL)
        if not alive:
            return
        time.sleep(0.01)


def end_all() -> None:
    """Kill every live child tree this process started, and every orphan they left."""
    with _STATE.lock:
        kids = list(_STATE.children.values())
        first = _STATE.first_start
    for t in kids:
        t.killed_by_us = True
        end_tree(t.pid, t.start)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            t.proc.wait(5)
    if _LINUX and first is not None:
        # Orphans of children that already ended: handed to us, not in our session, born after our first child.
        me, my_sid = os.getpid(), os.getsid(0)
        for _ in range(100):
            procs = _procs()
            with _STATE.lock:
                live = set(_STATE.children)
            left = [pid for pid, p in procs.items()
                    if p.ppid == me and pid not in live and p.sid != my_sid and p.start >= first]
            if not left:
                return
            for pid in left:
                end_tree(pid, first)
                if procs[pid].zombie:
                    with contextlib.suppress(OSError):
                        os.waitpid(pid, os.WNOHANG)
                else:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)


def _spawn(argv: Sequence[str], *, what: str, cwd: Path | str | None, env: Mapping[str, str] | None,
           stdin: int | IO[Any] | None, stdout: int, stderr: int) -> _Tracked:
    raise_if_interrupted()
    _ensure_subreaper()
    if cwd is not None and not Path(cwd).is_dir():
        raise ChildError(f"{what}: cannot run {argv[0]} in {cwd}: not a directory")
    preexec = _die_with_parent_fn()
    # An interrupt while the child starts is raised once it is tracked (so it is killed, never lost).
    with _critical(), _STATE.lock:
        try:
            proc = subprocess.Popen(
                list(argv), cwd=cwd, env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL if stdin is None else stdin, stdout=stdout, stderr=stderr,
                start_new_session=True, close_fds=True, preexec_fn=preexec,
            )
        except OSError as exc:
            raise ChildError(f"{what}: cannot run {argv[0]} ({exc.strerror or exc})", start_failed=True) from None
        tracked = _Tracked(proc)
        _STATE.children[proc.pid] = tracked
        if _STATE.first_start is None or tracked.start < _STATE.first_start:
            _STATE.first_start = tracked.start
    return tracked


def _forget(t: _Tracked) -> None:
    with _STATE.lock:
        _STATE.children.pop(t.pid, None)


# ---------------------------------------------------------------------------
# Output


class _Sink:
    """A capped output file shared by the pumps of one child (a new file: never through a planted link)."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path = path
        self.cap = cap
        self.written = 0
        self.dropped = 0
        self.lock = threading.Lock()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a link or file planted at the name is removed, never followed
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)

    def write(self, data: bytes) -> None:
        with self.lock:
            room = max(self.cap - self.written, 0)
            part = data[:room]
            view = memoryview(part)
            while view:
                view = view[os.write(self.fd, view):]
            self.written += len(part)
            self.dropped += len(data) - len(part)

    def close(self) -> None:
        with self.lock:
            if self.fd < 0:
                return
            if self.dropped:
                note = (f"\n[dsv4patch: {self.dropped} more bytes of output after the first {self.cap} "
                        "were not kept]\n").encode()
                with contextlib.suppress(OSError):
                    os.write(self.fd, note)
            os.close(self.fd)
            self.fd = -1


class _Pump(threading.Thread):
    """Reads one pipe to its end: the last ``keep`` bytes kept, everything passed to the sink."""

    def __init__(self, fd: int, keep: int, sink: _Sink | None, on_bytes: Any,
                 on_chunk: Callable[[bytes], None] | None = None) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.keep = keep
        self.sink = sink
        self.on_bytes = on_bytes
        self.on_chunk = on_chunk
        self.error: BaseException | None = None  # what on_chunk raised (the child is then killed)
        self.tail = bytearray()
        self.seen = 0
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if not ready:
                    continue
                chunk = os.read(self.fd, _READ)
                if not chunk:
                    return
                if self.on_chunk is not None:
                    self.on_chunk(chunk)
                self.seen += len(chunk)
                self.tail += chunk
                if len(self.tail) > 2 * self.keep:
                    del self.tail[: len(self.tail) - self.keep]
                if self.sink is not None:
                    self.sink.write(chunk)
                self.on_bytes(len(chunk))
        except (OSError, ValueError):
            return
        except BaseException as exc:  # on_chunk failed: the child's output is of no further use
            self.error = exc
            self.on_bytes(-1)

    def text(self) -> str:
        return bytes(self.tail[-self.keep:] if self.keep else b"").decode("utf-8", errors="replace")

    def finish(self, timeout: float = 5.0) -> None:
        self.join(timeout)
        if self.is_alive():  # something outside the tree still holds the pipe: stop reading it
            self.stop.set()
            self.join(1.0)
        with contextlib.suppress(OSError):
            os.close(self.fd)


# ---------------------------------------------------------------------------
# Results


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


@frozen
class Finished:
    """How a child ended, and what is kept of its output (bounded)."""

    argv: tuple[str, ...]
    what: str
    returncode: int | None  # its exit status; None when a signal ended it
    killed_by_signal: int | None  # the signal that ended it (ours at a deadline or on an interrupt, or another's)
    timed_out: bool  # ran past its deadline: killed
    flooded: bool  # printed more than its flood limit: killed
    interrupted: bool  # dsv4patch was interrupted while it ran: killed (run() raises Interrupted instead)
    stdout: str  # the last ``keep`` bytes of stdout, decoded (errors="replace")
    stderr: str  # the same for stderr ("" when merged into the output file only)
    stdout_bytes: int  # bytes it printed on stdout in all
    stderr_bytes: int
    output: Path | None  # the file its output was streamed to
    dropped: int  # bytes past the output file's cap, not written
    seconds: float
    deadline: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not (self.timed_out or self.flooded or self.interrupted)

    @property
    def text(self) -> str:
        """stdout then stderr tails (what a message quotes)."""
        return "\n".join(s for s in (self.stdout.strip(), self.stderr.strip()) if s)

    def status(self) -> str:
        """How it ended, in words: ``exit 1``, ``killed by SIGSEGV``, ``did not finish within 120 s``."""
        if self.timed_out:
            return f"did not finish within {self.deadline:g} s (killed)"
        if self.flooded:
            return f"printed {self.stdout_bytes + self.stderr_bytes} bytes, more than it may (killed)"
        if self.interrupted:
            return "interrupted"
        if self.killed_by_signal is not None:
            return f"killed by {signal_name(self.killed_by_signal)}"
        return f"exit {self.returncode}"

    def last_line(self, limit: int = 300) -> str:
        lines = [ln for ln in self.text.splitlines() if ln.strip()]
        return (lines[-1] if lines else "no output")[:limit]


def _check_deadline(deadline: float, what: str) -> float:
    if not isinstance(deadline, (int, float)) or not math.isfinite(deadline) or deadline <= 0:
        raise ValueError(f"{what}: a child's deadline must be a finite number of seconds > 0, not {deadline!r}")
    return float(deadline)


def _bounds_error(fin: Finished, flood: int | None) -> ChildError:
    argv0 = fin.argv[0] if fin.argv else "?"
    if fin.timed_out:
        return ChildError(f"{fin.what}: {argv0} did not finish within {fin.deadline:g} s; dsv4patch ended it "
                          f"and every process it started (last output: {fin.last_line()!r})")
    return ChildError(f"{fin.what}: {argv0} printed more than {flood} bytes, far more than its answer may be; "
                      "dsv4patch ended it and every process it started")


class _FloodCount:
    """The pumps' byte counter for one child: kills its group once it has printed more than
    ``flood`` bytes (or when a pump's ``on_chunk`` failed, ``n`` < 0)."""

    def __init__(self, pid: int, flood: int | None, flooded: threading.Event) -> None:
        self.pid = pid
        self.flood = flood
        self.flooded = flooded
        self.lock = threading.Lock()
        self.total = 0

    def __call__(self, n: int) -> None:
        if n < 0:  # on_chunk failed: stop the child
            self._kill()
            return
        with self.lock:
            self.total += n
            over = self.flood is not None and self.total > self.flood and not self.flooded.is_set()
            if over:
                self.flooded.set()
        if over:
            self._kill()

    def _kill(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)


def _start_pumps(proc: subprocess.Popen[bytes], pumps: list[_Pump], keep: int, sink: _Sink | None,
                 count: _FloodCount, on_chunk: Callable[[bytes], None] | None) -> None:
    """One reader thread per pipe of ``proc``, appended to ``pumps`` as each starts (so the caller
    can finish those that did); ``on_chunk`` goes to the stdout pump only."""
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            fd = os.dup(stream.fileno())
            stream.close()
            pumps.append(_Pump(fd, keep, sink, count, on_chunk if not pumps else None))


def _wait(proc: subprocess.Popen[bytes], end: float, flooded: threading.Event) -> bool:
    """Wait for ``proc`` until the monotonic time ``end`` or a flood; whether it ran past ``end``."""
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return proc.poll() is None
        try:
            proc.wait(min(left, 0.05))
            return False
        except subprocess.TimeoutExpired:
            if flooded.is_set():
                return False


def _reap(tracked: _Tracked, pumps: list[_Pump]) -> None:
    """End the child's whole tree, whatever brought us here, and drain its pipes."""
    end_tree(tracked.pid, tracked.start)  # the deadline, a flood, an interrupt, or leftovers of a normal end
    tracked.proc.wait()
    for p in pumps:
        p.finish()
    _forget(tracked)


def _finished(argv: Sequence[str], what: str, proc: subprocess.Popen[bytes], *, timed_out: bool, flooded: bool,
              pumps: list[_Pump], output: Path | None, sink: _Sink | None, t0: float, deadline: float) -> Finished:
    """How the reaped child ended, from its return code, the pumps and the sink."""
    rc = proc.returncode
    sig = -rc if rc is not None and rc < 0 else None
    # A child that died of a signal (or any other way) while an interrupt arrived was killed by it.
    was_interrupted = interrupted(0.2 if sig in INTERRUPT_SIGNALS else 0.0)
    return Finished(
        argv=tuple(str(a) for a in argv), what=what, returncode=None if sig is not None else rc,
        killed_by_signal=sig, timed_out=timed_out, flooded=flooded,
        interrupted=was_interrupted, stdout=pumps[0].text(), stderr=pumps[1].text() if len(pumps) > 1 else "",
        stdout_bytes=pumps[0].seen, stderr_bytes=pumps[1].seen if len(pumps) > 1 else 0,
        output=output, dropped=sink.dropped if sink is not None else 0,
        seconds=time.monotonic() - t0, deadline=deadline,
    )


def run(
    argv: Sequence[str],
    *,
    deadline: float,
    what: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: int | IO[Any] | None = None,
    output: Path | None = None,
    merge: bool = False,
    keep: int = KEEP,
    output_cap: int = OUTPUT_CAP,
    flood: int | None = None,
    check_bounds: bool = True,
    on_chunk: Callable[[bytes], None] | None = None,
) -> Finished:
    """Run ``argv`` to its end within ``deadline`` seconds (see the module docstring).

    ``what`` names the step for messages ("nvcc --version", "--python X probe").
    ``output``: stream stdout and stderr there as they come (a new file, capped at
    ``output_cap``).  ``merge``: stderr goes into stdout (one tail, in order).
    ``flood``: kill the child once it has printed more than this many bytes.
    ``on_chunk``: called in a reader thread with each piece of stdout as it is
    read (bytes; a line may be split between pieces): a parser of an output too
    large to keep; what it raises ends the child and is raised here.
    """
    deadline = _check_deadline(deadline, what)
    t0 = time.monotonic()
    flooded = threading.Event()
    sink = _Sink(output, output_cap) if output is not None else None
    pumps: list[_Pump] = []
    timed_out = False
    try:
        tracked = _spawn(argv, what=what, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT if merge else subprocess.PIPE)
        try:
            _start_pumps(tracked.proc, pumps, keep, sink, _FloodCount(tracked.proc.pid, flood, flooded), on_chunk)
            timed_out = _wait(tracked.proc, t0 + deadline, flooded)
            tracked.killed_by_us = tracked.killed_by_us or timed_out or flooded.is_set()
        finally:
            _reap(tracked, pumps)
    finally:
        if sink is not None:
            sink.close()
    fin = _finished(argv, what, tracked.proc, timed_out=timed_out, flooded=flooded.is_set(), pumps=pumps,
                    output=output, sink=sink, t0=t0, deadline=deadline)
    if fin.interrupted:
        raise Interrupted(_STATE.signal)
    if pumps[0].error is not None:
        raise pumps[0].error
    if check_bounds and (fin.timed_out or fin.flooded):
        raise _bounds_error(fin, flood)
    return fin


class Child:
    """A watched child (see the module docstring): its output in a capped log file, its tree ended on exit."""

    def __init__(self, argv: Sequence[str], *, what: str, log: Path, cwd: Path | str | None = None,
                 env: Mapping[str, str] | None = None, stdin: int | IO[Any] | None = None,
                 log_cap: int = LOG_CAP) -> None:
        self.argv = tuple(str(a) for a in argv)
        self.what = what
        self.log = Path(log)
        self.cwd = cwd
        self.env = env
        self.stdin = stdin
        self.log_cap = log_cap
        self._tracked: _Tracked | None = None
        self._pump: _Pump | None = None
        self._sink: _Sink | None = None
        self._t0 = 0.0
        self._result: Finished | None = None

    def start(self) -> Child:
        if self._tracked is not None:
            raise RuntimeError(f"{self.what}: started twice")
        self._sink = _Sink(self.log, self.log_cap)
        try:
            self._tracked = _spawn(self.argv, what=self.what, cwd=self.cwd, env=self.env, stdin=self.stdin,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except BaseException:
            self._sink.close()
            raise
        self._t0 = time.monotonic()
        proc = self._tracked.proc
        assert proc.stdout is not None
        fd = os.dup(proc.stdout.fileno())
        proc.stdout.close()
        self._pump = _Pump(fd, 0, self._sink, lambda n: None)
        return self

    def __enter__(self) -> Child:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.finish()

    @property
    def pid(self) -> int:
        return self._live().pid

    def _live(self) -> _Tracked:
        if self._tracked is None:
            raise RuntimeError(f"{self.what}: not started")
        return self._tracked

    def poll(self) -> int | None:
        """Its exit status (negative: the signal), or None while it runs."""
        return self._live().proc.poll()

    def send_signal(self, sig: int, *, group: bool = False) -> bool:
        """Send ``sig`` to the child (``group``: to its process group); False if it is gone."""
        t = self._live()
        if t.proc.poll() is not None:
            return False
        try:
            if group:
                os.killpg(t.pid, sig)
            else:
                os.kill(t.pid, sig)
        except OSError:
            return False
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` s (None: until it exits); True if it has exited."""
        try:
            self._live().proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill_tree(self) -> None:
        """SIGKILL the child and every process of its tree now."""
        t = self._live()
        t.killed_by_us = True
        end_tree(t.pid, t.start)

    def tail(self, n: int = KEEP) -> str:
        """The last ``n`` bytes of its log (read back bounded, decoded with errors="replace")."""
        if self._sink is None:
            return ""
        try:
            fd = os.open(self.log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return ""
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, max(0, min(n, size)), max(0, size - n))
        finally:
            os.close(fd)
        return data.decode("utf-8", errors="replace")

    def finish(self) -> Finished:
        """End the tree (if it still runs), wait, close the log; how it ended.  Idempotent."""
        if self._result is not None:
            return self._result
        t = self._live()
        try:
            if t.proc.poll() is None:
                t.killed_by_us = True
            end_tree(t.pid, t.start)
            t.proc.wait()
            if self._pump is not None:
                self._pump.finish()
        finally:
            _forget(t)
            if self._sink is not None:
                self._sink.close()
        rc = t.proc.returncode
        sig = -rc if rc is not None and rc < 0 else None
        sink = self._sink
        self._result = Finished(
            argv=self.argv, what=self.what, returncode=None if sig is not None else rc, killed_by_signal=sig,
            timed_out=False, flooded=False, interrupted=interrupted(),
            stdout=self.tail(KEEP), stderr="", stdout_bytes=self._pump.seen if self._pump else 0, stderr_bytes=0,
            output=self.log, dropped=sink.dropped if sink is not None else 0,
            seconds=time.monotonic() - self._t0, deadline=math.inf,
        )
        return self._result


def ask_python(python: str, code: str, *args: str, marker: str, label: str, deadline: float = PROBE_DEADLINE,
               env: Mapping[str, str] | None = None, cwd: Path | str | None = None) -> tuple[Finished, Any]:
    """Ask the interpreter ``python`` (see the module docstring); ``label`` names it in messages."""
    from dsv4patch import safeio

    try:
        fin = run([python, "-c", code, *args], deadline=deadline, what=f"{label}: the probe", env=env, cwd=cwd,
                  flood=PROBE_OUTPUT, keep=PROBE_OUTPUT)
    except ChildError as exc:
        if exc.start_failed:
            raise ParameterError(f"{label}: cannot run it ({str(exc).rsplit('(', 1)[-1].rstrip(')')}); "
                             "give the path of a Python interpreter") from None
        raise
    prefix = marker + " "
    line = next((ln for ln in fin.stdout.splitlines() if ln.startswith(prefix)), None)
    if line is None:
        return fin, None
    value = safeio.loads_json(line[len(prefix):], label=f"{label}: its answer", limit=PROBE_OUTPUT,
                              error=ParameterError)
    return fin, value
