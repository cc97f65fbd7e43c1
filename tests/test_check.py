"""check: every status of a patch, on a real git pin, through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import MINI_FILES, git_pin, local_pin, sh, write_lock


def run_check(cli, lock: Path, cache: Path):
    res = cli("check", "--lock", lock, "--cache-dir", cache, "--format", "json")
    return res, json.loads(res.out) if res.out.strip().startswith("{") else None


def statuses(report: dict, pin: str = "p") -> dict[str, str]:
    return {k: v["status"] for k, v in report["pins"][pin]["patches"].items()}


def test_clean_offset_conflict_not_checked(tmp_path, upstream, cli):
    d = tmp_path / "lock"
    d.mkdir()
    worker = MINI_FILES["vllm/worker.py"]
    upstream.patch(d / "0001-clean.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "NEW = 1\n"}, "clean one")
    # A patch made against a tree with 3 extra lines at the top of worker.py: applies with offset -3.
    shifted = "# a\n# b\n# c\n# d\n# e\n# f\n" + worker
    upstream_shift = tmp_path / "shift"
    sh(tmp_path, "clone", "-q", str(upstream.path), str(upstream_shift))
    (upstream_shift / "vllm/worker.py").write_text(shifted)
    sh(upstream_shift, "commit", "-qam", "shift")
    (upstream_shift / "vllm/worker.py").write_text(shifted.replace("return 0", "return 2"))
    sh(upstream_shift, "commit", "-qam", "offset one")
    Path(sh(upstream_shift, "format-patch", "-1", "-o", str(tmp_path))).rename(d / "0002-offset.patch")
    upstream.patch(d / "0003-conflict.patch", "c", {"vllm/worker.py": worker.replace("return z", "return z + 1")}, "base")
    # Make 0003 conflict: rewrite its context line "    z = y * 2" -> "    z = y * 5"
    text = (d / "0003-conflict.patch").read_text().replace(" def step(x):", " def step(x, y):")
    (d / "0003-conflict.patch").write_text(text)
    upstream.patch(d / "0004-after.patch", "d", {"csrc/kernel.cuh": "int length = max(row_len, 0);\nint k = 4;\n"}, "after")
    # Depends on 0003 by its files (worker.py), and 0006 by declaration (a trailer).
    upstream.patch(d / "0005-same-file.patch", "e", {"vllm/worker.py": worker + "E = 5\n"}, "same file")
    upstream.patch(d / "0006-declared.patch", "f", {"vllm/__init__.py": "F = 6\n"},
                   "declared\n\nDepends-On: 0005")
    names = ["0001-clean.patch", "0002-offset.patch", "0003-conflict.patch", "0004-after.patch",
             "0005-same-file.patch", "0006-declared.patch"]
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": names})
    res, rep = run_check(cli, lock, tmp_path / "cache")
    assert res.rc == 1, res.err
    st = statuses(rep)
    # A failing patch blocks only the patches that depend on it; 0004 is independent.
    assert st == {"0001-clean.patch": "clean", "0002-offset.patch": "offset",
                  "0003-conflict.patch": "conflict", "0004-after.patch": "clean",
                  "0005-same-file.patch": "not-checked", "0006-declared.patch": "not-checked"}
    cells = rep["pins"]["p"]["patches"]
    off = cells["0002-offset.patch"]["hunks"][0]
    assert off["file"] == "vllm/worker.py" and off["hunk"] == 1 and off["detail"] == "offset -6 lines"
    conflict = cells["0003-conflict.patch"]["hunks"][0]
    assert conflict["file"] == "vllm/worker.py" and conflict["hunk"] == 1
    assert conflict["expected"] == "def step(x, y):" and conflict["actual"] == "def step(x):"
    assert conflict["line"] == 1
    assert "0003-conflict.patch" in cells["0005-same-file.patch"]["message"]
    assert "vllm/worker.py" in cells["0005-same-file.patch"]["message"]
    assert "Depends-On: 0005-same-file.patch" in cells["0006-declared.patch"]["message"]
    assert rep["pins"]["p"]["patched_tree"] is None
    # Every failure names the command that resolves it.
    assert "--3way" in cells["0003-conflict.patch"]["next"] and "resolve --continue" in cells["0003-conflict.patch"]["next"]
    assert "refresh" in cells["0002-offset.patch"]["next"]
    assert "next" not in cells["0004-after.patch"]
    text = cli("check", "--lock", lock, "--cache-dir", tmp_path / "cache")
    assert "next: resolve it in a tree: `dsv4patch apply --pin p --tree DIR --3way`" in text.out


def test_expectations_make_exit_zero_and_table(tmp_path, upstream, cli):
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": "X = 1\n"}, "a")
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-a.patch"]})
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "cache")
    assert res.rc == 0, res.err
    assert "clean" in res.out and "ok" in res.out
    md = cli("check", "--lock", lock, "--cache-dir", tmp_path / "cache", "--format", "markdown")
    assert md.out.startswith("| pin | 0001 |")


def test_missing_file_and_already_applied(tmp_path, upstream, cli):
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-gone.patch", "a", {"vllm/worker.py": "changed\n"}, "a")
    text = (d / "0001-gone.patch").read_text().replace("vllm/worker.py", "vllm/removed.py")
    (d / "0001-gone.patch").write_text(text)
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream, 'expect = "missing-file"')},
                      {"main": ["0001-gone.patch"]})
    res, rep = run_check(cli, lock, tmp_path / "cache")
    assert statuses(rep) == {"0001-gone.patch": "missing-file"}
    assert res.rc == 0
    assert rep["pins"]["p"]["patches"]["0001-gone.patch"]["hunks"][0]["file"] == "vllm/removed.py"

    # A pin whose tree already has the change: the reverse applies.
    d2 = tmp_path / "lock2"
    d2.mkdir()
    p = upstream.patch(d2 / "0001-x.patch", "b", {"vllm/envs.py": "X = 2\n"}, "x")
    sh(upstream.path, "apply", str(p))
    sh(upstream.path, "commit", "-qam", "carry it")
    upstream.commit = sh(upstream.path, "rev-parse", "HEAD")
    lock2 = write_lock(d2 / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-x.patch"]})
    res, rep = run_check(cli, lock2, tmp_path / "cache")
    assert res.rc == 1
    cell = rep["pins"]["p"]["patches"]["0001-x.patch"]
    assert cell["status"] == "already-applied" and cell["evidence"]["decided_by"] == ["reverse-apply"]


def test_upstream_by_markers_beats_forward_apply(tmp_path, upstream, cli):
    """An addition-only hunk applies forward to a tree that already has the fix."""
    d = tmp_path / "lock"
    d.mkdir()
    new_fn = "\n\ndef clamp_len(n):\n    return max(n, 0)\n"
    upstream.patch(
        d / "0001-add.patch", "a", {"vllm/worker.py": MINI_FILES["vllm/worker.py"] + new_fn},
        "add clamp\n\nFix: 1\nUpstream-Marker: vllm/worker.py: def clamp_len",
    )
    # Upstream wrote the same function elsewhere in the file (independently).
    (upstream.path / "vllm/worker.py").write_text("def clamp_len(n):\n    return n if n > 0 else 0\n\n\n" + MINI_FILES["vllm/worker.py"])
    sh(upstream.path, "commit", "-qam", "upstream fix")
    upstream.commit = sh(upstream.path, "rev-parse", "HEAD")
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream, 'expect = "upstream"')}, {"main": ["0001-add.patch"]})
    # Sanity: a forward apply alone would succeed (and duplicate the function).
    assert sh(upstream.path, "apply", "--check", str(d / "0001-add.patch")) == ""
    res, rep = run_check(cli, lock, tmp_path / "cache")
    cell = rep["pins"]["p"]["patches"]["0001-add.patch"]
    assert cell["status"] == "upstream", cell
    assert cell["evidence"]["decided_by"] == ["markers"]
    assert res.rc == 0


def test_drift_and_unexpected_status_name_the_next_step(tmp_path, upstream, cli):
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": "X = 1\n"}, "a")
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream, f'patched_tree = "{"0" * 40}"\nexpect = "upstream"')},
                      {"main": ["0001-a.patch"]})
    res, rep = run_check(cli, lock, tmp_path / "cache")
    assert res.rc == 1
    notes = " ".join(rep["notes"])
    assert "differs from the lock's" in notes and "`dsv4patch lock --update --pin p`" in notes
    cell = rep["pins"]["p"]["patches"]["0001-a.patch"]
    assert cell["status"] == "clean" and 'expect_patches."0001-a.patch" = "clean"' in cell["next"]


def test_offline_check_reports_cached_pins_and_marks_the_others_not_fetched(tmp_path, upstream, cli):
    from conftest import sdist_pin
    from test_json_contract import validate

    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": "X = 1\n"}, "a")
    unreachable = sdist_pin("offline", "a" * 40, "0" * 64, "http://127.0.0.1:9/vllm-0.0.1.tar.gz")
    gone = (git_pin("gone", upstream).replace(str(upstream.path), str(tmp_path / "no-such-remote"))
            .replace(upstream.commit, "b" * 40))
    lock = write_lock(d / "l.toml", {"offline": unreachable, "p": git_pin("p", upstream), "gone": gone},
                      {"main": ["0001-a.patch"]})
    res = cli("check", "--lock", lock, "--cache-dir", tmp_path / "cache", "--format", "json")
    assert res.rc == 4, res.err
    rep = validate("check", res.out)
    assert rep["pins"]["p"]["ok"] is True and statuses(rep) == {"0001-a.patch": "clean"}
    for name in ("offline", "gone"):
        assert rep["pins"][name]["status"] == "not-fetched"
        assert f"dsv4patch fetch --pin {name}" in rep["pins"][name]["next"]
    text = cli("check", "--lock", lock, "--cache-dir", tmp_path / "cache")
    assert text.rc == 4 and "not-fetched" in text.out and "clean" in text.out


def test_a_copied_lock_says_its_paths_are_relative_to_it(tmp_path, upstream, cli):
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": "X = 1\n"}, "a")
    fork_pin = local_pin("fork", "../upstream", upstream.commit)
    lock = write_lock(d / "l.toml", {"fork": fork_pin}, {"main": ["0001-a.patch"]})
    assert cli("check", "--lock", lock, "--cache-dir", tmp_path / "c").rc == 0
    elsewhere = tmp_path / "other" / "deeper"
    elsewhere.mkdir(parents=True)
    (elsewhere / "l.toml").write_text(lock.read_text())
    res = cli("check", "--lock", elsewhere / "l.toml", "--cache-dir", tmp_path / "c2")
    assert res.rc == 4 and "relative to the lock file's directory" in res.err and "upstream" in res.err
    (elsewhere / "l.toml").write_text(lock.read_text().replace('"../upstream"', '"../../upstream"'))
    res = cli("check", "--lock", elsewhere / "l.toml", "--cache-dir", tmp_path / "c2")
    assert res.rc == 3 and "relative to the lock file's directory" in res.err and "main.series" in res.err
    (elsewhere / "main.series").write_text("0001-a.patch\n")
    (elsewhere / "0001-a.patch").write_text((d / "0001-a.patch").read_text())
    assert cli("check", "--lock", elsewhere / "l.toml", "--cache-dir", tmp_path / "c2").rc == 0


def test_a_local_pins_checkout_that_moved_on_is_marked_and_the_other_pins_are_checked(tmp_path, upstream, cli):
    """Two pins on one fork checkout (the forks page's acme and acme-next): once the maintainer works on, the
    checkout is at one pin's commit at most, and a plain `check` stopped at the first other one with exit 5,
    reporting no pin. Now that pin is `source-moved` (its error and what to do), every other pin is checked
    and reported, and the exit is 5; `check --pin` of a pin at its commit is 0; a dirty checkout is moved too."""
    from conftest import validate_json

    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": "X = 1\n"}, "a")
    fork = tmp_path / "fork"
    sh(tmp_path, "clone", "-q", str(upstream.path), str(fork))
    first = sh(fork, "rev-parse", "HEAD")
    (fork / "ACME.md").write_text("ours\n")
    sh(fork, "add", "ACME.md")
    sh(fork, "commit", "-qm", "acme: readme")
    second = sh(fork, "rev-parse", "HEAD")
    lock = write_lock(d / "l.toml", {"acme": local_pin("acme", fork, first),
                                     "acme-next": local_pin("acme-next", fork, second),
                                     "up": git_pin("up", upstream)}, {"main": ["0001-a.patch"]})
    cache = ("--cache-dir", tmp_path / "c")
    res = cli("check", "--lock", lock, *cache, "--format", "json")
    assert res.rc == 5, res.err
    rep = json.loads(res.out)
    validate_json("check", res.out)
    assert rep["pins"]["acme"]["status"] == "source-moved" and "the lock pins" in rep["pins"]["acme"]["error"]
    assert f"switch --detach {first[:12]}" in rep["pins"]["acme"]["next"]
    assert rep["pins"]["acme-next"]["ok"] is True and rep["pins"]["up"]["ok"] is True
    text = cli("check", "--lock", lock, *cache)
    assert text.rc == 5 and "source moved" in text.out and "acme: source-moved: " in text.out, text.out
    assert cli("check", "--lock", lock, "--pin", "acme-next", *cache).rc == 0
    (fork / "ACME.md").write_text("edited\n")
    res = cli("check", "--lock", lock, "--pin", "acme-next", *cache, "--format", "json")
    assert res.rc == 5 and "uncommitted changes" in json.loads(res.out)["pins"]["acme-next"]["error"], res.out
