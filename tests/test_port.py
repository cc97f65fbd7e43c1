"""port: carry the series to another pin, on real pins and on small git pins."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import LOCK, MINI_FILES, ROOT, git_pin, sh, write_lock
from dsv4patch.lock import load


def project_copy(tmp_path: Path) -> Path:
    """locks/ and patches/ laid out like the repository, so variants land in patches/variants/."""
    shutil.copytree(ROOT / "patches", tmp_path / "patches")
    (tmp_path / "locks").mkdir()
    shutil.copyfile(LOCK, tmp_path / "locks" / "vllm.toml")
    return tmp_path / "locks" / "vllm.toml"


@pytest.mark.network
def test_port_to_028_drops_all_seven_with_evidence(tmp_path, shared_cache, cli):
    lock = project_copy(tmp_path)
    res = cli("port", "--lock", lock, "--to", "0.28.0", "--name", "p028", "--series", "dsv4",
              "--cache-dir", shared_cache,
              "--format", "json")
    assert res.rc == 0, res.err
    rep = json.loads(res.out)
    assert [v["action"] for v in rep["patches"].values()] == ["drop"] * 7
    assert all("markers" in v["evidence"]["decided_by"] for v in rep["patches"].values())
    pin = load(lock).pin("p028")
    assert pin.expect == "upstream" and not pin.variants and pin.commit == "2cf0a6915"
    assert (tmp_path / "patches/variants/p028/PORT.md").read_text().count("| drop |") == 7
    assert cli("check", "--lock", lock, "--pin", "p028", "--cache-dir", shared_cache).rc == 0


@pytest.mark.network
def test_port_to_026_conflicts_then_reproduces_the_hand_variants(tmp_path, shared_cache, cli):
    lock = project_copy(tmp_path)
    before = lock.read_text()
    res = cli("port", "--lock", lock, "--to", "0.26.0", "--name", "p026", "--cache-dir", shared_cache,
              "--format", "json")
    rep = json.loads(res.out)
    assert res.rc == 1
    actions = {k[:4]: v["action"] for k, v in rep["patches"].items()}
    # 0003 bounds the draft's seq_lens next to code 0.26.0 does not have (the
    # sampling-state copy), so the automatic port stops there.
    assert actions == {"0001": "refresh", "0002": "merge", "0003": "conflict", "0004": "not-ported",
                       "0005": "not-ported", "0006": "not-ported", "0007": "not-ported",
                       "0008": "not-ported", "0009": "not-ported"}
    hunk = rep["patches"][next(k for k in rep["patches"] if k.startswith("0003"))]["conflicts"][0]
    assert hunk["file"] == "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"
    assert "max_model_len" in hunk["patch"]  # the two sides are reported
    assert "nothing was written" in rep["notes"]
    assert lock.read_text() == before and not (tmp_path / "patches/variants/p026").exists()

    # With the maintainer's port as resolutions: it completes, reproduces the hand
    # port's tree exactly, and says where the automatic port agreed with it.
    res = cli("port", "--lock", lock, "--to", "0.26.0", "--name", "p026", "--cache-dir", shared_cache,
              "--resolutions", ROOT / "patches/variants/0.26.0", "--format", "json")
    assert res.rc == 0, res.out
    rep = json.loads(res.out)
    assert set(rep["check"].values()) == {"clean"}
    details = {k[:4]: (v["action"], v["detail"]) for k, v in rep["patches"].items()}
    assert all(details[n][0] == "keep" for n in ("0004", "0007", "0008", "0009"))
    for n in ("0001", "0002"):
        assert details[n][0] == "resolved" and "gives the same tree" in details[n][1], details[n]
    assert "automatic 3-way merge conflicted" in details["0005"][1]
    assert "automatic 3-way merge conflicted" in details["0003"][1]
    # The hand port adapted these tests to 0.26.0's signatures; the automatic one could not.
    assert "differs in tests/v1/attention/test_dsv4_fix6" in details["0006"][1]
    ported = load(lock).pin("p026")
    hand = load(LOCK).pin("0.26.0")
    assert sorted(ported.variants) == sorted(hand.variants)
    assert ported.patched_tree == hand.patched_tree  # the tree `verify --pin 0.26.0` proves


def test_port_refreshes_merges_and_reports_conflicts_on_git_pins(tmp_path, upstream, cli):
    root = tmp_path / "proj"
    (root / "locks").mkdir(parents=True)
    (root / "patches").mkdir()
    old_commit = upstream.commit
    worker = MINI_FILES["vllm/worker.py"]
    upstream.patch(root / "patches/0001-off.patch", "a", {"vllm/worker.py": worker.replace("return 0", "return 2")}, "one")
    upstream.patch(root / "patches/0002-merge.patch", "b",
                   {"vllm/envs.py": MINI_FILES["vllm/envs.py"].replace("VAR_20 = 20", "VAR_20 = 200")}, "two")
    lock = write_lock(root / "locks/vllm.toml", {"old": git_pin("old", upstream)},
                      {"main": ["../patches/0001-off.patch", "../patches/0002-merge.patch"]})
    # The new upstream: worker.py shifted by 4 lines (offset), envs.py changed near VAR_20 (3-way).
    (upstream.path / "vllm/worker.py").write_text("# 1\n# 2\n# 3\n# 4\n" + worker)
    envs = MINI_FILES["vllm/envs.py"].replace("VAR_17 = 17", "VAR_17 = 17  # moved on")
    (upstream.path / "vllm/envs.py").write_text(envs)
    sh(upstream.path, "commit", "-qam", "drift")
    new_commit = sh(upstream.path, "rev-parse", "HEAD")
    res = cli("port", "--lock", lock, "--from", "old", "--to", new_commit, "--git", upstream.path,
              "--name", "new", "--cache-dir", tmp_path / "c", "--format", "json")
    assert res.rc == 0, res.out + res.err
    rep = json.loads(res.out)
    assert [v["action"] for v in rep["patches"].values()] == ["refresh", "merge"]
    assert set(rep["check"].values()) == {"clean"}
    variant = (root / "patches/variants/new/0002-merge.patch").read_text()
    assert "VAR_20 = 200" in variant and "Ported to vLLM new by dsv4patch port: merge" in variant
    assert cli("check", "--lock", lock, "--cache-dir", tmp_path / "c").rc == 0

    # A conflicting upstream: the same line changed differently; nothing is written.
    (upstream.path / "vllm/envs.py").write_text(MINI_FILES["vllm/envs.py"].replace("VAR_20 = 20", "VAR_20 = 21"))
    sh(upstream.path, "commit", "-qam", "conflict")
    third = sh(upstream.path, "rev-parse", "HEAD")
    before = lock.read_text()
    res = cli("port", "--lock", lock, "--from", "old", "--to", third, "--git", upstream.path,
              "--name", "third", "--cache-dir", tmp_path / "c", "--format", "json")
    rep = json.loads(res.out)
    assert res.rc == 1
    c = rep["patches"]["0002-merge.patch"]["conflicts"][0]
    assert c["file"] == "vllm/envs.py" and c["target"] == "VAR_20 = 21" and c["patch"] == "VAR_20 = 200"
    assert lock.read_text() == before and not (root / "patches/variants/third").exists()
    del old_commit


def test_port_numbers_each_series_on_its_own(tmp_path, upstream, cli):
    """Refreshed variants are numbered within their series: [PATCH n/2] for the
    two of "main", [PATCH 1/1] for the one of "extra" (not n/3 across both)."""
    root = tmp_path / "proj"
    (root / "locks").mkdir(parents=True)
    (root / "patches").mkdir()
    worker = MINI_FILES["vllm/worker.py"]
    envs = MINI_FILES["vllm/envs.py"]
    upstream.patch(root / "patches/0001-a.patch", "a", {"vllm/worker.py": worker.replace("return 0", "return 2")}, "one")
    upstream.patch(root / "patches/0002-b.patch", "b", {"vllm/envs.py": envs.replace("VAR_30 = 30", "VAR_30 = 300")}, "two")
    upstream.patch(root / "patches/0003-c.patch", "c", {"vllm/envs.py": envs.replace("VAR_5 = 5", "VAR_5 = 50")}, "three")
    lock = write_lock(root / "locks/vllm.toml",
                      {"old": git_pin("old", upstream, extra='series = ["main", "extra"]')},
                      {"main": ["../patches/0001-a.patch", "../patches/0002-b.patch"],
                       "extra": ["../patches/0003-c.patch"]})
    # Every patch needs a refresh: lines shifted at the top of both files.
    (upstream.path / "vllm/worker.py").write_text("# 1\n# 2\n" + worker)
    (upstream.path / "vllm/envs.py").write_text("# 1\n# 2\n" + envs)
    sh(upstream.path, "commit", "-qam", "drift")
    new_commit = sh(upstream.path, "rev-parse", "HEAD")
    res = cli("port", "--lock", lock, "--from", "old", "--to", new_commit, "--git", upstream.path,
              "--name", "new", "--cache-dir", tmp_path / "c", "--format", "json")
    assert res.rc == 0, res.out + res.err
    subjects = {
        name: next(line for line in (root / "patches/variants/new" / name).read_text().splitlines()
                   if line.startswith("Subject: "))
        for name in ("0001-a.patch", "0002-b.patch", "0003-c.patch")
    }
    assert subjects == {
        "0001-a.patch": "Subject: [PATCH 1/2] one",
        "0002-b.patch": "Subject: [PATCH 2/2] two",
        "0003-c.patch": "Subject: [PATCH 1/1] three",
    }
