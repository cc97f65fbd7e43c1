"""--format json is a contract: schema_version everywhere, real outputs validate against schemas/.

Each output here comes from the real CLI on real git pins (a fork with a real
conflict, see test_resolve.py); nothing is hand-written.  jsonschema is a
test-only dependency (docs/dependencies.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from conftest import LOCK, ROOT, sh, validate_json
from dsv4patch.main import COMMANDS
from test_resolve import RESOLVED_WORKER, fork_lock  # noqa: F401  (fixture)

SCHEMAS = ROOT / "schemas"


validate = validate_json


def test_every_command_and_the_error_object_have_a_schema():
    assert {p.name.split(".")[0] for p in SCHEMAS.glob("*.schema.json")} == set(COMMANDS) | {"error"}


def test_real_outputs_validate(tmp_path, cli, fork_lock):
    cache = ("--cache-dir", tmp_path / "cache")
    fork = ("--lock", fork_lock, "--pin", "fork", *cache)
    tree = tmp_path / "t"
    check = validate("check", cli("check", "--lock", fork_lock, *cache, "--format", "json").out)
    cell = check["pins"]["fork"]["patches"]["0002-worker.patch"]
    assert cell["status"] == "conflict" and cell["next"]
    ws = validate("apply", cli("apply", *fork, "--tree", tree, "--3way", "--no-build", "--format", "json").out)
    assert ws["workspace"]["conflicts"] == ["vllm/worker.py"]
    abort = validate("resolve", cli("resolve", "--abort", "--tree", tree, "--format", "json").out)
    assert set(abort) >= {"tree", "head"}
    assert cli("apply", *fork, "--tree", tree, "--3way", "--no-build").rc == 1
    (tree / "vllm/worker.py").write_text(RESOLVED_WORKER)
    cont = validate("resolve", cli("resolve", "--continue", "--tree", tree, "--lock", fork_lock, *cache,
                                   "--format", "json").out)
    assert cont["ok"] is True and "pins" in cont
    validate("status", cli("status", "--tree", tree, "--lock", fork_lock, "--pin", "fork", "--format", "json").out)
    sh(tree, "commit", "-q", "--allow-empty", "-m", "Empty marker commit")
    empty = cli("refresh", *fork, "--tree", tree, "--format", "json")
    assert empty.rc == 5 and "changes nothing" in validate("error", empty.out)["error"]["message"]
    sh(tree, "reset", "-q", "--hard", "HEAD~1")
    (tree / "vllm/extra.py").write_text("E = 1\n")
    sh(tree, "add", "vllm/extra.py")
    sh(tree, "commit", "-qm", "Add extra")
    refresh = validate("refresh", cli("refresh", *fork, "--tree", tree, "--format", "json").out)
    assert "new" in {v["action"] for v in refresh["patches"].values()}
    validate("lock", cli("lock", "--update", "--lock", fork_lock, *cache, "--format", "json").out)
    validate("fetch", cli("fetch", "--lock", fork_lock, *cache, "--format", "json").out)
    port = cli("port", "--lock", fork_lock, "--from", "upstream", "--local", tmp_path / "fork", "--name", "f2",
               "--dry-run", *cache, "--format", "json")
    validate("port", port.out)
    err = cli("apply", *fork, "--tree", tmp_path / "lock" / "vllm.toml", "--format", "json")
    assert err.rc == 2
    assert validate("error", err.out)["error"]["kind"] == "usage"


def test_every_lock_output_validates(cli, monkeypatch: pytest.MonkeyPatch):
    """lock prints three objects (--update is validated above on a fork's lock): --build-args and
    --check-build-args, matching and not, on the real lock; each is one strict branch of the schema."""
    schema = json.loads((SCHEMAS / "lock.schema.json").read_text())
    args = cli("lock", "--lock", LOCK, "--pin", "0.27.1", "--build-args", "--format", "json")
    assert args.rc == 0
    built = validate("lock", args.out)
    assert built["VLLM_PIN"] == "0.27.1" and "ok" not in built
    for key in ("VLLM_PIN", "VLLM_VERSION", "VLLM_COMMIT", "PATCHED_TREE", "PATCH_SET_SHA256",
                "LOCK_SHA256", "IMAGE_VERSION"):
        monkeypatch.setenv(key, built[key])
    good = cli("lock", "--lock", LOCK, "--pin", "0.27.1", "--check-build-args", "--format", "json")
    assert good.rc == 0 and validate("lock", good.out)["ok"] is True
    monkeypatch.setenv("PATCHED_TREE", "0" * 40)
    bad = cli("lock", "--lock", LOCK, "--pin", "0.27.1", "--check-build-args", "--format", "json")
    checked = validate("lock", bad.out)
    assert bad.rc == 1 and checked["ok"] is False and checked["build_args"] == {
        k: v for k, v in built.items() if k != "schema_version"}
    strict = jsonschema.Draft202012Validator(schema)
    assert not strict.is_valid({**checked, "build_args": {**checked["build_args"], "EXTRA": "1"}})
    for doc in (built, checked):
        assert not strict.is_valid({**doc, "unknown": 1})


def test_markdown_carries_conflict_evidence_and_next_lines(tmp_path, cli, fork_lock):
    md = cli("check", "--lock", fork_lock, "--cache-dir", tmp_path / "c", "--format", "markdown").out
    assert md.startswith("| pin |")
    lines = md.splitlines()
    conflict = [line for line in lines if line.startswith("- fork 0002-worker.patch: conflict: vllm/worker.py hunk #1")]
    assert conflict, md
    assert any(line.strip().startswith("next: resolve it in a tree") for line in lines)


@pytest.mark.parametrize("name", sorted(p.name for p in SCHEMAS.glob("*.schema.json")))
def test_schema_files_are_valid_json_schema(name: str):
    jsonschema.Draft202012Validator.check_schema(json.loads((SCHEMAS / name).read_text()))
    assert Path(SCHEMAS / name).read_text().endswith("\n")
