"""port to a fork checkout: --local, --dry-run, commit ids without a source, the fork's
version, untruncated messages, --resolutions warnings, evidence as text in PORT.md."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import MINI_FILES, Upstream, git_pin, sh, write_lock
from dsv4patch.errors import EXIT_USAGE

ENVS = MINI_FILES["vllm/envs.py"]
LONG = "vllm/model_executor/layers/quantization/utils/offsets_everywhere.py"
WORKER = MINI_FILES["vllm/worker.py"]


def _project(tmp_path: Path, upstream: Upstream) -> tuple[Path, Path]:
    (upstream.path / LONG).parent.mkdir(parents=True)
    (upstream.path / LONG).write_text(ENVS)
    sh(upstream.path, "add", LONG)
    sh(upstream.path, "commit", "-qm", "a module with a long path")
    upstream.commit = sh(upstream.path, "rev-parse", "HEAD")
    root = tmp_path / "proj"
    (root / "locks").mkdir(parents=True)
    (root / "patches").mkdir()
    # Six hunks far apart in envs.py: on the fork each gets an offset (a long detail).
    edited = ENVS
    for i in (0, 8, 16, 24, 32, 39):
        edited = edited.replace(f"VAR_{i} = {i}\n", f"VAR_{i} = {i * 100}\n")
    upstream.patch(root / "patches/0001-many.patch", "a", {LONG: edited}, "many hunks")
    upstream.patch(root / "patches/0002-up.patch", "b", {"vllm/worker.py": WORKER + "UP = 1\n"},
                   "up\n\nFix: 2\nUpstream-Marker: vllm/worker.py: UP = 1")
    lock = write_lock(root / "locks/vllm.toml", {"old": git_pin("old", upstream)},
                      {"main": ["0001-many.patch", "0002-up.patch"]}, series_dir="../patches")
    fork = tmp_path / "fork"
    sh(tmp_path, "clone", "-q", str(upstream.path), str(fork))
    (fork / LONG).write_text("# fork\n# of\n# vllm\n# here\n" + ENVS)
    (fork / "vllm/worker.py").write_text(WORKER + "UP = 1\n")
    sh(fork, "commit", "-qam", "fork")
    sh(fork, "tag", "v0.99.1")
    return lock, fork


def test_port_to_a_local_fork(tmp_path, upstream, cli):
    lock, fork = _project(tmp_path, upstream)
    root = lock.parent.parent
    head = sh(fork, "rev-parse", "HEAD")
    cache = ("--cache-dir", tmp_path / "c")
    # A commit id without a source says what is missing (no PyPI lookup of vllm-<hex>).
    bare = cli("port", "--lock", lock, "--to", head, *cache)
    assert bare.rc == EXIT_USAGE and "--git URL" in bare.err and "--local PATH" in bare.err
    before = lock.read_text()
    dry = cli("port", "--lock", lock, "--local", fork, "--name", "fork", "--dry-run", *cache, "--format", "json")
    assert dry.rc == 0, dry.err + dry.out
    rep = json.loads(dry.out)
    assert rep["dry_run"] is True
    assert {n: v["action"] for n, v in rep["patches"].items()} == {
        "0001-many.patch": "refresh", "0002-up.patch": "drop"}
    assert lock.read_text() == before and not (root / "patches/variants/fork").exists()
    res_dir = tmp_path / "resolutions"
    res_dir.mkdir()
    (res_dir / "0009-typo.patch").write_text("not a patch of the series\n")
    res = cli("port", "--lock", lock, "--local", fork, "--name", "fork", "--resolutions", res_dir,
              *cache, "--format", "json")
    assert res.rc == 0, res.err + res.out
    rep = json.loads(res.out)
    assert any("warning" in n and "0009-typo.patch" in n for n in rep["notes"])
    assert any("vllm_version 0.99.1" in n for n in rep["notes"])
    detail = rep["patches"]["0001-many.patch"]["detail"]
    assert detail.count("offset +4 lines") >= 3 and len(detail) > 200
    variant = (root / "patches/variants/fork/0001-many.patch").read_text()
    assert f"refresh ({detail})." in variant  # the whole detail, never cut off
    port_md = (root / "patches/variants/fork/PORT.md").read_text()
    assert "- marker: `vllm/worker.py` contains `UP = 1`" in port_md
    assert "{'" not in port_md and detail in port_md
    text = lock.read_text()
    assert 'vllm_version = "0.99.1"' in text and 'kind = "local"' in text
    assert cli("check", "--lock", lock, "--pin", "fork", *cache).rc == 0
