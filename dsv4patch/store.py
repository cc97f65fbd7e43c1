"""Content-addressed cache for downloads and materialized pins, with file locks.

Layout under the cache root (``$DSV4PATCH_CACHE``, else
``$XDG_CACHE_HOME/dsv4patch``, else ``~/.cache/dsv4patch``)::

    blobs/sha256/<hex>     verified downloads, named by their content hash
    trees/<key>.git        a pin as a bare git repository (see tree.py)
    venvs/<key>/           test environments (see testenv.py)
    kernels/<key>/         compiled kernel objects (see kernels/)
    locks/<name>.lock      flock files; two runs on one entry wait for each other
    tmp/                   partial downloads and work directories, never read as cache entries

Every entry of ``tmp/`` is *owned*: a file is flocked by the run writing it, a
directory holds a flocked ``.owner`` file, for as long as that run lives (a
lock ends with its process, even one killed with SIGKILL).  Each
:meth:`Store.open` removes the entries no live run owns (:func:`stale_tmp`):
what a killed or interrupted run left.  A run also removes, as it exits
(:func:`remove_owned`, called by ``main`` after its child programs have
ended), every work directory it still owns, so an interrupt that lands
between a directory's creation and the ``try`` that would remove it leaves
nothing behind either; only one handed to :meth:`Store.keep_tmp` (``verify
--keep``) outlives its run, until a later run sweeps it.

A download is streamed into ``tmp/``, hashed, and moved into ``blobs/`` only
when its size and sha256 match the lock, so a bad or truncated download never
enters the cache.  With a warm cache nothing touches the network.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from dsv4patch import safeio, settings
from dsv4patch.errors import (
    BusyError,
    CacheError,
    FetchError,
    IntegrityError,
    NotFetchedError,
    param,
)
from dsv4patch.hashing import hash_file
from dsv4patch.nextstep import Blank, Step, mention
from dsv4patch.records import frozen

if TYPE_CHECKING:
    from dsv4patch.progress import Progress

_SEED = Step.of("fetch", sdist=Blank("FILE"))  # a file put into the cache by hand

CHUNK = 1 << 20


def mutex_timeout() -> float:
    """``DSV4PATCH_LOCK_TIMEOUT`` in seconds (default 600), as the run's settings hold it (validated there)."""
    return settings.active().lock_timeout


@contextmanager
def file_mutex(
    path: Path, what: str, timeout: float | None = None, inherit: bool = False
) -> Iterator[None]:
    """Exclusive flock on ``path``; waits up to ``timeout`` s, then BusyError.

    With ``inherit`` the lock's file descriptor is passed on to child
    processes (``git.run(..., tied=True)`` keeps it open): the flock then
    lasts until this process *and* every child it started have exited, so a
    git still writing the tree when its parent is killed keeps the tree locked.
    """
    timeout = mutex_timeout() if timeout is None else timeout
    path.parent.mkdir(parents=True, exist_ok=True)
    # Never through a planted link, never blocking on a FIFO: the pid written below would truncate
    # whatever a link points at.
    fd = safeio.open_regular(path, os.O_RDWR | os.O_CREAT, 0o644, error=CacheError)
    if inherit:
        os.set_inheritable(fd, True)
    try:
        deadline = time.monotonic() + timeout
        pause = 0.01  # doubled up to 0.2 s: a lock held for a moment (a git still exiting) costs a moment
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                    raise BusyError(
                        f"{what} is locked by another dsv4patch run (pid {holder}, lock file "
                        f"{path}); wait for it to finish, or raise DSV4PATCH_LOCK_TIMEOUT "
                        f"(now {timeout:g} s)"
                    ) from None
                time.sleep(pause)
                pause = min(2 * pause, 0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


# The flocked ``.owner`` descriptor of each work directory this process made in ``tmp/``.
_OWNERS: dict[str, int] = {}
_KEPT: list[int] = []  # the descriptors of the directories handed to Store.keep_tmp
_OWNER = ".owner"
_NEW_DIR = ".new-"


def _rmtree(path: Path | str) -> None:
    """``shutil.rmtree(path, ignore_errors=True)``: it never follows a link inside.  ``shutil`` (with
    ``bz2`` and ``lzma``) is imported by the runs that remove a directory, not at every start-up."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _probe_writable(tmp: Path) -> None:
    """Create and remove a file in ``tmp``: an OSError if the cache cannot be written.  A probe an
    interrupt leaves behind has no owner, so :func:`sweep_tmp` removes it once it is old."""
    probe = tmp / f".probe-{safeio.token()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.close(fd)
    os.unlink(probe)


def _real_dirs(root: Path, parts: Sequence[str]) -> Path:
    """``root/parts...``, each component a real directory (a link there is removed, never followed)."""
    path = root
    for part in parts:
        if not part or part in (".", "..") or "/" in part:
            raise CacheError(f"internal: {part!r} is not a cache directory name")
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            path.mkdir(exist_ok=True)
            continue
        if stat.S_ISLNK(st.st_mode):
            os.unlink(path)  # planted: removed, its target untouched
            path.mkdir()
        elif not stat.S_ISDIR(st.st_mode):
            raise CacheError(f"{path} is not a directory; dsv4patch keeps its cache entries there: remove it")
    return path


def stale_tmp(store: Store) -> list[Path]:
    """The entries of ``<cache>/tmp`` that no live run owns (left by killed runs); see the module docstring.

    An entry without an owner (made by an older dsv4patch, or caught in the
    instant between its creation and its lock) counts only once it is older than
    :data:`dsv4patch.safeio.STALE_AGE`.
    """
    tmp = store.root / "tmp"
    try:
        names = sorted(os.listdir(tmp))
    except OSError:
        return []
    now = time.time()
    stale: list[Path] = []
    for name in names:
        p = tmp / name
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            has_owner = os.path.lexists(p / _OWNER)
        elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            has_owner = name.endswith(safeio.PARTIAL)
        else:
            continue
        if has_owner:
            if not safeio.owned_by_a_live_writer(p):
                stale.append(p)
        elif now - st.st_mtime > safeio.STALE_AGE and not safeio.owned_by_a_live_writer(p):
            stale.append(p)
    return stale


def remove_owned() -> list[Path]:
    """Remove every work directory this process made in a cache's ``tmp/`` and still owns (a run
    that exits, however, leaves none; see the module docstring); the removed paths."""
    removed = []
    for name in list(_OWNERS):
        fd = _OWNERS.pop(name, None)
        _rmtree(name)
        if fd is not None:
            os.close(fd)
        removed.append(Path(name))
    return removed


def sweep_tmp(store: Store) -> list[Path]:
    """Remove :func:`stale_tmp`'s entries; the removed paths."""
    removed = stale_tmp(store)
    for p in removed:
        if p.is_dir() and not p.is_symlink():
            _rmtree(p)
        else:
            safeio.remove_file(p)
    return removed


def _unusable(root: Path, exc: OSError) -> str:
    """Why the cache cannot be made at ``root``, from the error making it raised: a file in the way
    (``--cache-dir`` naming a file, or a directory below one) is named as such, not as unwritable."""
    found = safeio.in_the_way(root)
    if found is not None:
        return f"is {found.what}" if found.itself else f"cannot be made: {found.path} is {found.what}"
    where = f": {exc.filename}" if exc.filename and str(exc.filename) != str(root) else ""
    return f"is not writable ({exc.strerror}{where})"


@frozen
class Store:
    root: Path

    @classmethod
    def open(cls, root: Path) -> Store:
        """The cache at ``root`` (the command's ``--cache-dir``, else :meth:`Settings.cache_root`)."""
        root = Path(root)
        try:
            root.mkdir(parents=True, exist_ok=True)
            for sub in ("blobs/sha256", "trees", "locks", "tmp"):
                _real_dirs(root, sub.split("/"))
            _probe_writable(root / "tmp")
        except OSError as exc:
            raise CacheError(
                f"cache directory {root} {_unusable(root, exc)}; "
                f"point DSV4PATCH_CACHE (or {param('cache_dir')}) at a writable directory"
            ) from None
        store = cls(root)
        sweep_tmp(store)  # what killed runs left
        return store

    def subdir(self, *parts: str) -> Path:
        """``<cache>/<parts...>`` as real directories, made if missing.

        A link planted at any of them is removed (and a real directory made in its
        place): nothing dsv4patch writes or uses in its cache goes through a link
        (a ``toolchains/torch-<key>`` link to another torch is never used).
        """
        return _real_dirs(self.root, parts)

    def mutex(self, name: str) -> AbstractContextManager[None]:
        return file_mutex(self.root / "locks" / f"{name}.lock", f"cache entry {name!r}")

    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / "sha256" / sha256

    def tmpdir(self, prefix: str) -> Path:
        """A new private work directory ``<cache>/tmp/<prefix><random>``, owned by this process.

        Made under a ``.new-`` name, its ``.owner`` file flocked, then renamed: a
        concurrent :func:`sweep_tmp` never takes it while this process lives.
        Remove it with :meth:`remove_tmp` (or ``shutil.rmtree``: the lock then
        ends with the process).
        """
        import tempfile  # only a run that makes a work directory needs it (and shutil, random with it)

        tmp = self.root / "tmp"
        new = Path(tempfile.mkdtemp(prefix=_NEW_DIR + prefix, dir=tmp))
        final = tmp / (prefix + new.name[len(_NEW_DIR + prefix):])
        fd = os.open(new / _OWNER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _OWNERS[str(final)] = fd  # before the rename: remove_owned finds it whenever an interrupt lands
            os.rename(new, final)
        except BaseException:
            _OWNERS.pop(str(final), None)
            os.close(fd)
            _rmtree(new)
            _rmtree(final)
            raise
        return final

    def remove_tmp(self, path: Path) -> None:
        """Remove a work directory :meth:`tmpdir` made, and give up its lock."""
        _rmtree(path)
        fd = _OWNERS.pop(str(path), None)
        if fd is not None:
            os.close(fd)

    def keep_tmp(self, path: Path) -> None:
        """Leave a work directory :meth:`tmpdir` made in place when this run exits (the user asked to
        keep it); it stays owned while the run lives, and a later run sweeps it."""
        fd = _OWNERS.pop(str(path), None)
        if fd is not None:
            _KEPT.append(fd)

    def fetch_blob(
        self, url: str, sha256: str, size: int | None, what: str, progress: Progress
    ) -> Path:
        """The verified file for ``sha256``, downloading it from ``url`` if needed."""
        dest = self.blob_path(sha256)
        with self.mutex(f"blob-{sha256}"):
            if os.path.lexists(dest):
                if safeio.is_regular(dest) and hash_file(dest) == sha256:
                    return dest
                dest.unlink()  # corrupted cache entry, or a link planted there: fetch it again
            if not url:
                raise NotFetchedError(
                    f"{what}: not in the cache ({dest}) and the lock has no url; "
                    f"run `{mention(Step.of('lock', update=True))}` with network access"
                )
            # The configured package index first (index.py); the lock's url is a hint.
            from dsv4patch import index

            notes: list[str] = []
            errors: list[FetchError] = []
            for cand in index.download_candidates(url, sha256, notes):
                try:
                    self._download_to(dest, cand.url, sha256, size, what, progress, cand.auth_from)
                    return dest
                except FetchError as exc:
                    errors.append(exc)
            if len(errors) == 1 and not notes:
                raise errors[0]
            # A file with the wrong hash is the louder failure: report it as such.
            cls = IntegrityError if any(isinstance(e, IntegrityError) for e in errors) else FetchError
            raise cls("; then ".join([*notes, *(str(e) for e in errors)]))

    def _download_to(self, dest: Path, url: str, sha256: str, size: int | None, what: str,
                     progress: Progress, auth_from: str | None = None) -> None:
        """Download ``url`` into the cache as ``dest`` if its size and sha256 are right."""
        from dsv4patch.urls import http_url_problem, redact

        problem = http_url_problem(url)
        if problem:
            raise FetchError(f"{what}: refusing to download {redact(url)}: {problem}; only http(s) "
                             f"URLs are downloaded (seed a local file with `{mention(_SEED)}`)")
        fd, tmp = safeio.create_owned(self.root / "tmp", "dl")  # owned: swept if this run is killed
        try:
            with os.fdopen(fd, "wb", closefd=False) as fh:  # fd (and its lock) closed after the rename
                got, digest, expected_len = _download(url, fh, what, progress, size, auth_from)
            url = redact(url)
            if expected_len is not None and got < expected_len:
                raise IntegrityError(
                    f"{what}: truncated download from {url}: got {got} of {expected_len} "
                    "bytes; nothing was cached, run the command again"
                )
            if size is not None and got != size:
                raise IntegrityError(
                    f"{what}: download from {url} is {got} bytes, the lock says {size}; "
                    "nothing was cached. If the lock is wrong, fix it; else retry"
                )
            if digest != sha256:
                raise IntegrityError(
                    f"{what}: sha256 mismatch for {url}: got {digest}, the lock says "
                    f"{sha256}; nothing was cached. Do not edit the lock to match unless "
                    "you trust the new file"
                )
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
            os.close(fd)

    def seed_blob(self, path: Path, sha256: str, *, limit: int) -> bool:
        """Copy ``path`` into the cache as blob ``sha256``; False if it was already there.

        The copy is hashed, not the original, so a file that changes while it
        is read never enters the cache under the wrong name; no temporary file
        or directory is left behind.  ``path`` is read through :mod:`dsv4patch.safeio`:
        a regular file (a link the user named is followed), at most ``limit`` bytes.
        """
        dest = self.blob_path(sha256)
        with self.mutex(f"blob-{sha256}"):
            if safeio.is_regular(dest) and hash_file(dest) == sha256:
                return False
            safeio.remove_file(dest)  # corrupted, or a link planted there
            fd, tmp = safeio.create_owned(self.root / "tmp", "seed")
            try:
                h = hashlib.sha256()
                src = safeio.open_regular(path, error=FetchError, what=str(path), follow=True)
                try:
                    with os.fdopen(fd, "wb", closefd=False) as out:
                        for chunk in safeio.chunks(src, limit, label=str(path), error=IntegrityError):
                            out.write(chunk)
                            h.update(chunk)
                finally:
                    os.close(src)
                if h.hexdigest() != sha256:
                    raise IntegrityError(f"{path} changed while it was copied into the cache; "
                                         "nothing was cached, run the command again")
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
                os.close(fd)
            return True


# A download the lock does not size is still capped (docs/trust.md "Bounds").
UNSIZED_LIMIT = 4 << 30


def _download(
    url: str, fh: BinaryIO, what: str, progress: Progress, size: int | None,
    auth_from: str | None = None,
) -> tuple[int, str, int | None]:
    """Stream ``url`` into ``fh``: at most the lock's ``size`` + 1 bytes, within the transfer deadline."""
    import http.client  # only a download needs them (a warm run never loads http/ssl)
    import urllib.error

    from dsv4patch.index import TooLarge, TooSlow, body_chunks, open_url, redact_reason, transfer_timeout
    from dsv4patch.urls import redact

    h = hashlib.sha256()
    got = 0
    shown = redact(url)
    limit = size if size is not None else UNSIZED_LIMIT
    deadline = time.monotonic() + transfer_timeout()
    try:
        with open_url(url, auth_from) as resp:
            length = resp.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            if expected is not None and expected > limit:
                pinned = f"the lock pins {size} bytes" if size is not None else f"the most read is {limit} bytes"
                raise IntegrityError(
                    f"{what}: {shown} announces {expected} bytes, {pinned}; not downloaded, nothing "
                    "was cached. If the lock is wrong, fix it; else the server is serving another file")
            with progress.task(f"download {what}", expected or size) as task:
                chunks = body_chunks(resp, limit=limit, deadline=deadline, label=f"{what}: {shown}")
                while True:
                    try:
                        chunk = next(chunks, b"")
                    except TooLarge:
                        pinned = f"the {size} bytes the lock pins" if size is not None else f"{limit} bytes"
                        raise IntegrityError(
                            f"{what}: download from {shown} sent more than {pinned}; cut off there, "
                            "nothing was cached. If the lock is wrong, fix it; else retry") from None
                    except TooSlow as exc:
                        raise FetchError(f"{exc}; nothing was cached, run the command again, or raise "
                                         "DSV4PATCH_DOWNLOAD_TIMEOUT / lower DSV4PATCH_DOWNLOAD_MIN_RATE for a "
                                         "slow link") from None
                    except (OSError, ValueError, http.client.HTTPException) as exc:  # connection cut mid-body
                        raise IntegrityError(
                            f"{what}: download from {shown} broke off after {got} bytes "
                            f"({redact_reason(exc)}); nothing was cached, run the command again"
                        ) from None
                    if not chunk:
                        break
                    fh.write(chunk)
                    h.update(chunk)
                    got += len(chunk)
                    task.advance(len(chunk))
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        reason = redact_reason(getattr(exc, "reason", exc))
        raise NotFetchedError(
            f"{what}: cannot download {shown} ({reason}) and it is not in the cache. "
            "Check network access to the package index, or copy the file into the cache "
            f"with `{mention(_SEED)}`"
        ) from None
    return got, h.hexdigest(), expected
