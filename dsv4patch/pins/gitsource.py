"""The ``git`` source kind: a commit fetched from a git remote (any URL git accepts
that cannot run a command: :func:`dsv4patch.pins.lock.git_url_problem`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4patch import git
from dsv4patch.errors import FetchError, LockFileError, NotFetchedError
from dsv4patch.pins.lock import Source, git_url_problem
from dsv4patch.pins.source import register
from dsv4patch.urls import redact

if TYPE_CHECKING:
    from dsv4patch.pins.lock import LockTable, Pin
    from dsv4patch.progress import Progress
    from dsv4patch.store import Store


class GitSource:
    kind = "git"
    keys = frozenset({"url"})
    fork = True
    checks_base_tree = True

    def parse(self, table: LockTable) -> Source:
        url = table.get("url", str)
        problem = git_url_problem(url)
        if problem:
            raise LockFileError(
                f"{table.lock_path}: {table.where}.url = {redact(url)!r} is refused: {problem}; use an https://, "
                "ssh://, file:// or scp-like user@host:path URL, or a local path"
            )
        if "://" not in url and not url.startswith("/") and ":" not in url:
            url = str((table.lock_path.resolve().parent / url).resolve())
        return Source(kind=self.kind, url=url)

    def cache_key(self, pin: Pin) -> str:
        return f"git-{pin.commit}"

    def check_checkout(self, pin: Pin, own_tree: Path | None) -> None:
        return None  # a remote: the commit id pins the files

    def fetch_files(self, pin: Pin, store: Store, dest: Path, progress: Progress, own_tree: Path | None) -> None:
        with progress.task(f"fetch {pin.name} from {pin.source.url}", None):
            export_commit(pin, pin.source.url, dest)

    def describe(self, source: Source) -> str:
        return source.url

    def checkout_path(self, source: Source) -> Path | None:
        return None

    def to_entry(self, source: Source, lock_dir: Path) -> dict[str, Any]:
        return {"kind": self.kind, "url": source.url}


def export_commit(pin: Pin, url: str, dest: Path) -> None:
    """Check out the pinned commit's files from ``url`` (a git remote or a vetted local checkout)."""
    fetch_repo = dest.parent / "fetch.git"
    git.run(dest.parent, ["init", "-q", "--bare", str(fetch_repo)], repo=False)
    res = git.fetch_commit(fetch_repo, url, pin.commit)
    if not res.ok:
        res = git.fetch_all(fetch_repo, url)
        if not res.ok:
            raise NotFetchedError(f"pin {pin.name}: cannot fetch from {url}: {res.stderr.strip()}")
    if not git.has_object(fetch_repo, f"{pin.commit}^{{commit}}"):
        raise FetchError(f"pin {pin.name}: commit {pin.commit} is not in {url}")
    git.run(fetch_repo, ["--work-tree", str(dest), "checkout", "-f", pin.commit, "--", "."])
    import shutil  # a fetch, never a warm run's start-up (issue 39)

    shutil.rmtree(fetch_repo)


register(GitSource())
