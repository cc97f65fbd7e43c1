"""port: carry the series to another pin, on real pins and on small git pins."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import LOCK, MINI_FILES, ROOT, git_pin, sh, validate_json, write_lock
from dsv4patch.pins.lock import load


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
                       "0008": "not-ported", "0009": "not-ported", "0010": "not-ported"}
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


def test_port_refreshes_merges_and_reports_conflicts_on_git_pins(tmp_path, upstream, cli, monkeypatch):
    root = tmp_path / "proj"
    (root / "locks").mkdir(parents=True)
    (root / "patches").mkdir()
    old_commit = upstream.commit
    worker = MINI_FILES["vllm/worker.py"]
    upstream.patch(root / "patches/0001-off.patch", "a", {"vllm/worker.py": worker.replace("return 0", "return 2")}, "one")
    upstream.patch(root / "patches/0002-merge.patch", "b",
                   {"vllm/envs.py": MINI_FILES["vllm/envs.py"].replace("VAR_20 = 20", "VAR_20 = 200")}, "two")
    lock = write_lock(root / "locks/vllm.toml", {"old": git_pin("old", upstream)},
                      {"main": ["0001-off.patch", "0002-merge.patch"]}, series_dir="../patches")
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

    # issue 35: --resolutions as the docs write it, relative to where the command runs (it was
    # read from git's directory: a false conflict, "the resolution does not apply").
    (root / "res").mkdir()
    upstream.patch(root / "res/0002-merge.patch", "r",
                   {"vllm/envs.py": MINI_FILES["vllm/envs.py"].replace("VAR_20 = 20", "VAR_20 = 200")}, "two")
    monkeypatch.chdir(root)
    res = cli("port", "--lock", "locks/vllm.toml", "--from", "old", "--to", third, "--git", upstream.path,
              "--name", "third", "--resolutions", "res", "--cache-dir", tmp_path / "c", "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert json.loads(res.out)["patches"]["0002-merge.patch"]["action"] == "resolved"


def test_a_source_variant_that_applies_exactly_is_kept_as_the_new_pins_variant(tmp_path, upstream, cli):
    """A patch the source pin takes as a variant, kept unchanged by the port (it applies exactly on the new
    pin), stays that pin's variant: the new pin's entry names it (it named none, so the new pin took the
    series' own file, which does not apply there, and its first check failed)."""
    root = tmp_path / "proj"
    (root / "locks").mkdir(parents=True)
    (root / "patches/variants/old").mkdir(parents=True)
    worker = MINI_FILES["vllm/worker.py"]
    variant = upstream.patch(root / "patches/variants/old/0001-z.patch", "v",
                             {"vllm/worker.py": worker.replace("z = y * 2", "z = y * 3")}, "z")
    # The series' own file is written for a later upstream (y = x + 10): it does not apply at the pins.
    (upstream.path / "vllm/worker.py").write_text(worker.replace("y = x + 1", "y = x + 10"))
    sh(upstream.path, "commit", "-qam", "later")
    upstream.patch(root / "patches/0001-z.patch", "m",
                   {"vllm/worker.py": worker.replace("y = x + 1", "y = x + 10").replace("z = y * 2", "z = y * 3")},
                   "z")
    sh(upstream.path, "reset", "-q", "--hard", upstream.commit)
    (upstream.path / "vllm/envs.py").write_text(MINI_FILES["vllm/envs.py"].replace("VAR_30 = 30", "VAR_30 = 31"))
    sh(upstream.path, "commit", "-qam", "drift elsewhere")
    new_commit = sh(upstream.path, "rev-parse", "HEAD")
    rel = "../patches/variants/old/0001-z.patch"
    lock = write_lock(root / "locks/vllm.toml",
                      {"old": git_pin("old", upstream, extra=f'variants = {{ "0001-z.patch" = "{rel}" }}')},
                      {"main": ["0001-z.patch"]}, series_dir="../patches")
    assert cli("check", "--lock", lock, "--pin", "old", "--cache-dir", tmp_path / "c").rc == 0
    res = cli("port", "--lock", lock, "--from", "old", "--to", new_commit, "--git", upstream.path,
              "--name", "new", "--cache-dir", tmp_path / "c", "--format", "json")
    assert res.rc == 0, res.out + res.err
    assert json.loads(res.out)["patches"]["0001-z.patch"]["action"] == "keep"
    pin = load(lock).pins["new"]
    assert pin.variants == {"0001-z.patch": variant.resolve()}, pin.variants
    res = cli("check", "--lock", lock, "--pin", "new", "--cache-dir", tmp_path / "c")
    assert res.rc == 0, res.out + res.err


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
                      {"main": ["0001-a.patch", "0002-b.patch"],
                       "extra": ["0003-c.patch"]}, series_dir="../patches")
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


def test_port_workspace_opens_at_a_conflict_and_the_rerun_takes_the_resolution(tmp_path, upstream, cli):
    """--workspace DIR: the conflict left as a tree to edit; the same command again goes on."""
    root = tmp_path / "proj"
    (root / "locks").mkdir(parents=True)
    (root / "patches").mkdir()
    worker, envs = MINI_FILES["vllm/worker.py"], MINI_FILES["vllm/envs.py"]
    upstream.patch(root / "patches/0001-off.patch", "a", {"vllm/worker.py": worker.replace("return 0", "return 2")}, "one")
    upstream.patch(root / "patches/0002-merge.patch", "b", {"vllm/envs.py": envs.replace("VAR_20 = 20", "VAR_20 = 200")},
                   "two")
    lock = write_lock(root / "locks/vllm.toml", {"old": git_pin("old", upstream)},
                      {"main": ["0001-off.patch", "0002-merge.patch"]}, series_dir="../patches")
    # the new upstream: worker.py shifted (0001 refreshes), VAR_20 changed differently (0002 conflicts)
    (upstream.path / "vllm/worker.py").write_text("# 1\n# 2\n" + worker)
    (upstream.path / "vllm/envs.py").write_text(envs.replace("VAR_20 = 20", "VAR_20 = 21"))
    sh(upstream.path, "commit", "-qam", "conflict")
    new_commit = sh(upstream.path, "rev-parse", "HEAD")
    ws = tmp_path / "ws"
    port = ["port", "--lock", lock, "--from", "old", "--to", new_commit, "--git", upstream.path, "--name", "new",
            "--cache-dir", tmp_path / "c", "--workspace", ws, "--format", "json"]
    before = lock.read_text()

    # --dry-run writes nothing, a workspace included
    res = cli(*port, "--dry-run")
    assert res.rc == 1 and "workspace" not in json.loads(res.out) and not ws.exists(), res.out
    res = cli(*port)
    assert res.rc == 1, res.out + res.err
    rep = validate_json("port", res.out)
    assert rep["workspace"]["patch"] == "0002-merge.patch" and rep["workspace"]["conflicts"] == ["vllm/envs.py"]
    # the refreshed 0001 is committed on the new pin; 0002 is merged into the work tree with both sides
    # (the pin's base commit is the cache's own commit of upstream's tree)
    assert sh(ws, "log", "--format=%s").splitlines() == ["one", f"vLLM new (git, upstream commit {new_commit})"]
    assert sh(ws, "rev-parse", "HEAD") == rep["workspace"]["head"]
    assert "return 2" in (ws / "vllm/worker.py").read_text()
    text = (ws / "vllm/envs.py").read_text()
    assert "<<<<<<< target" in text and "VAR_20 = 21" in text and "VAR_20 = 200" in text
    assert lock.read_text() == before and not (root / "patches/variants/new").exists()

    # again without editing: the markers are named, nothing changes
    res = cli(*port)
    assert res.rc == 5 and "vllm/envs.py" in res.err and "conflict markers" in res.err, res.err
    # a workspace is bound to its port: another new pin name is refused
    other = cli(*[("other" if a == "new" else a) for a in port])
    assert other.rc == 5 and "opened by another port" in other.err, other.err

    # the workspace is a tree the user controls: a clean filter in its config would run on `git add`
    sh(ws, "config", "filter.evil.clean", f"touch {tmp_path / 'PWNED'}; cat")
    (ws / ".git/info/attributes").write_text("*.py filter=evil\n")
    res = cli(*port)
    assert res.rc == 5 and "filter.evil" in res.err and not (tmp_path / "PWNED").exists(), res.err
    sh(ws, "config", "--unset", "filter.evil.clean")
    (ws / ".git/info/attributes").unlink()

    # resolved by hand: the port takes it as 0002's resolution and completes
    resolved = "\n".join(ln for ln in text.splitlines() if not ln.startswith(("<<<<<<<", "|||||||", "=======", ">>>>>>>"))
                         and ln not in ("VAR_20 = 21", "VAR_20 = 20")) + "\n"
    (ws / "vllm/envs.py").write_text(resolved.replace("VAR_20 = 200", "VAR_20 = 210"))
    res = cli(*port)
    assert res.rc == 0, res.out + res.err
    rep = json.loads(res.out)
    assert rep["patches"]["0002-merge.patch"]["action"] == "resolved"
    assert "automatic 3-way merge conflicted" in rep["patches"]["0002-merge.patch"]["detail"]
    assert set(rep["check"].values()) == {"clean"}
    variant = (root / "patches/variants/new/0002-merge.patch").read_text()
    assert "+VAR_20 = 210" in variant and "-VAR_20 = 21" in variant and "Subject: [PATCH 2/2] two" in variant
    assert not (Path(sh(ws, "rev-parse", "--absolute-git-dir")) / "dsv4patch-port.json").exists()
    assert cli("check", "--lock", lock, "--pin", "new", "--cache-dir", tmp_path / "c").rc == 0


def test_port_workspace_state_is_checked_before_use(tmp_path, upstream, cli):
    """The state lives in a tree the user edits: commits must be commit ids, paths inside the tree."""
    from dsv4patch.checkout.states import PortState
    from dsv4patch.errors import TreeError
    from dsv4patch.forks import portspace

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("x")
    with pytest.raises(TreeError, match="neither empty nor a workspace"):
        portspace.read_state(ws)
    sh(ws, "init", "-q")
    assert portspace.read_state(ws) is None  # a git tree without one: the port decides (test_forks.py)
    good = {"lock": "/l", "from": "a", "to": "b", "patch": "0001-x.patch", "base_commit": "1" * 40,
            "at": "2" * 40, "conflicts": ["vllm/x.py"], "own": False, "orig_ref": None}
    sp = ws / ".git" / portspace.STATE
    for bad, why in (({"at": "HEAD~1"}, "not a full commit id"), ({"base_commit": "--output=/tmp/x"}, "not a full"),
                     ({"conflicts": ["../outside"]}, "inside the tree"), ({"conflicts": [".git/config"]}, "inside"),
                     ({"patch": 3}, "missing patch")):
        sp.write_text(json.dumps({**good, **bad}))
        with pytest.raises(TreeError, match=why):
            portspace.read_state(ws)
    sp.write_text(json.dumps(good))
    assert portspace.read_state(ws) == PortState.from_json(good)
    assert portspace.read_state(ws).to_json() == good
    assert portspace.read_state(tmp_path / "absent") is None


@pytest.mark.network
def test_port_workspace_to_026_walks_the_real_conflicts(tmp_path, shared_cache, cli):
    """The real port to 0.26.0 stops at 0003 and 0005; resolving each in the workspace (here with the
    maintainer's hand port of that patch) and rerunning the same command completes it."""
    lock = project_copy(tmp_path)
    ws = tmp_path / "ws"
    port = ["port", "--lock", lock, "--to", "0.26.0", "--name", "p026", "--cache-dir", shared_cache,
            "--workspace", ws, "--format", "json"]
    hand = ROOT / "patches/variants/0.26.0"
    seen = []
    for _ in range(4):
        res = cli(*port)
        rep = validate_json("port", res.out)
        if res.rc == 0:
            break
        assert res.rc == 1, res.err
        w = rep["workspace"]
        seen.append((w["patch"][:4], w["conflicts"]))
        text = "".join((ws / f).read_text() for f in w["conflicts"])
        assert "<<<<<<< target" in text and ">>>>>>> patch" in text
        # the maintainer's resolution: the hand-ported patch on the workspace's HEAD
        sh(ws, "checkout", "--", ".")
        sh(ws, "clean", "-fdq")  # the merge wrote the patch's new files too
        sh(ws, "apply", "--whitespace=nowarn", str(hand / w["patch"]))
    assert seen == [("0003", ["vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"]),
                    ("0005", seen[1][1])] and seen[1][1], seen
    actions = {k[:4]: (v["action"], v["detail"]) for k, v in rep["patches"].items()}
    for n in ("0003", "0005"):
        assert actions[n][0] == "resolved" and "automatic 3-way merge conflicted" in actions[n][1], actions[n]
    assert set(rep["check"].values()) == {"clean"}
    ported = load(lock).pin("p026")

    def changes(text: str) -> list[str]:
        return [ln for ln in text.splitlines()
                if ln[:1] in ("+", "-") and not ln.startswith(("+++", "---")) and ln != "-- "]

    # 0003 and 0005 as the maintainer resolved them: the same changes as the hand variants
    for n in ("0003", "0005"):
        name = next(p for p in ported.variants if p.startswith(n))
        mine = changes((tmp_path / "patches/variants/p026" / name).read_text())
        assert mine and mine == changes((hand / name).read_text())


def test_resolutions_that_are_not_a_directory_are_a_usage_error(tmp_path, cli):
    """`--resolutions patches/variants/0.26.0` typed from another directory named nothing, and the port went on
    with a warning per file and without them (exit 1); now exit 2 before anything runs, naming the path and the
    directory it is relative to."""
    from conftest import LOCK

    (tmp_path / "file").write_text("x")
    for where, why in ((tmp_path / "nowhere", "does not exist"), (tmp_path / "file", "is not a directory")):
        res = cli("port", "--lock", LOCK, "--to", "0.26.0", "--name", "x", "--resolutions", where, "--dry-run",
                  "--cache-dir", tmp_path / "c")
        assert res.rc == 2 and f"--resolutions {where}: {why}" in res.err, res
        assert not (tmp_path / "c").exists()
