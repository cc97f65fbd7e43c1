"""dsv4patch.delivery.provenance: an installed patched vLLM checked against its own SBOM, without the lock or sdist.

The real patched vLLM 0.27.1 wheel (vLLM's stock wheel, the lock's series, a
kernel library built here: tests/test_sbom.py's fixtures) is installed with
pip into a site directory, and an interpreter whose path has only that site
is probed as ``status --installed`` probes one.  Checked for real: every
patch peels off the installed files (``present``), a file put back to the
stock content makes its patch ``stock``, a local edit makes it ``other``, the
kernel library's sha256 is the SBOM's, the regression tests rebuilt from the
SBOM's patch texts are byte for byte the lock's, and a lock that describes
another patched tree is named as disagreeing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4patch.delivery import installed, provenance
from dsv4patch.kernels.identity import dist_name
from dsv4patch.pins import Context
from dsv4patch.progress import Progress
from dsv4patch.proofs.selftest import runner
from dsv4patch.series.pincheck import patched_tree
from dsv4patch.store import Store
from localindex import serve
from test_sbom import PIN, kernel_wheel, make_patched, needs_nvcc  # noqa: F401  (module fixture: the kernel wheel)

pytestmark = [pytest.mark.slow, needs_nvcc]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path, kernel_wheel: Path) -> dict:
    base = tmp_path_factory.mktemp("provenance")
    built = make_patched(base, shared_cache, kernel_wheel, ("w",))
    target = base / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                    str(target), str(built["w"].built.path)], check=True)
    python = base / "python-site"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={target} exec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    return {"site": target, "python": str(python), **built}


def _inspect(site: dict) -> provenance.SbomInspection:
    found = installed.probe(site["python"], dist_name(PIN))
    assert found.vllm is not None
    kernels = found.kernels
    library = None
    if kernels is not None:
        assert isinstance(kernels.build_info, dict) and isinstance(kernels.build_info["library"], str)
        library = str(Path(kernels.dir) / kernels.build_info["library"])
    return provenance.inspect(found.vllm, library)


def test_every_patch_of_the_sbom_is_present_in_the_installed_files(site):
    rep = _inspect(site)
    assert rep.ok, rep
    states = {n: p.state for n, p in rep.patches.items()}
    assert states["0001-DSV4-fix-1-Carry-the-dense-SWA-index-width-for-DSpar.patch"] == "present"
    assert states["0007-DSV4-fix-7-Clamp-top-k-row-lengths-before-any-path-d.patch"] == "present"  # kernel lib
    assert set(states.values()) == {"present"} and len(states) == 10
    assert rep.provenance.pin == PIN and rep.lock_checked is False
    assert list(rep.to_json()) == ["source", "provenance", "patches", "problems", "ok", "lock_checked"]


def test_a_file_put_back_to_stock_and_a_local_edit_are_named(site, shared_cache):
    rel = "vllm/v1/attention/backends/mla/indexer.py"  # fix 6's only shipped file
    fix6 = "0006-DSV4-fix-6-Clamp-indexer-MTP-decode-context-lengths-.patch"
    ctx = Context(lock=site["lock"], store=Store.open(shared_cache), progress=Progress(False))
    stock = patched_tree(ctx=ctx, pin=site["pin"]).by_path()[rel].base
    target = site["site"] / rel
    saved = target.read_bytes()
    try:
        target.write_bytes(stock)  # the pin's own file: fix 6 is not there
        rep = _inspect(site)
        assert not rep.ok and rep.patches[fix6].state == "stock"
        others = {n: p.state for n, p in rep.patches.items() if n != fix6}
        assert set(others.values()) == {"present"}
        target.write_bytes(saved.replace(b"tl.maximum(", b"tl.minimum(", 1))  # a local edit inside the fix
        rep = _inspect(site)
        assert rep.patches[fix6].state == "other" and rep.patches[fix6].problem
        assert "problem" in rep.patches[fix6].to_json()
    finally:
        target.write_bytes(saved)
    assert _inspect(site).ok


def test_the_regression_tests_from_the_sbom_are_the_locks(site, shared_cache):
    found = installed.probe(site["python"], "")
    assert found.vllm is not None
    from_sbom = provenance.tests_for(found.vllm)
    from_lock = runner.series_tests(PIN, ctx=Context(lock=site["lock"], store=Store.open(shared_cache),
                                                     progress=Progress(False)))
    assert from_sbom == from_lock and len(from_sbom) == 10


def test_a_lock_that_describes_another_patched_tree_disagrees(site):
    found = installed.probe(site["python"], "")
    assert found.vllm is not None
    prov = provenance.read(list(found.vllm.sboms))
    assert provenance.lock_problems(prov, site["pin"]) == []
    other = dataclasses.replace(site["pin"], patched_tree="0" * 40)
    assert provenance.lock_problems(prov, other) == [
        f"the installed vLLM was patched to tree {site['pin'].patched_tree[:12]}, the lock expects 000000000000 "
        "(another patch series)"]


def test_a_stock_install_has_nothing_to_check_without_the_lock():
    with pytest.raises(provenance.ProvenanceError, match="was not installed from a wheel `dsv4patch wheel` made"):
        provenance.read([])


def test_the_selftests_installed_check_takes_the_sbom_when_there_is_no_lock(site):
    res, vllm = runner.check_installed_sbom(site["python"], on_gpu=False)
    assert res.ok is True and vllm is not None
    assert "checked against the installed wheel's own SBOM" in res.note and "no lock here" in res.note
    assert res.data["report"]["source"] == "sbom"


def _status(site: dict, cwd: Path, *args: str) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if k != "DSV4PATCH_LOCK"}
    res = subprocess.run([sys.executable, "-m", "dsv4patch", "status", "--installed", "--python", site["python"],
                          "--format", "json", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return res.returncode, json.loads(res.stdout)


def test_status_installed_on_a_node_without_the_repository(site, tmp_path):
    # No lock here or above (a node with only dsv4patch installed): the installed wheel's own SBOM.
    rc, out = _status(site, tmp_path)
    assert rc == 0 and out["ok"] is True and out["pin"] == PIN
    assert any("checked against the installed wheel's own SBOM" in n for n in out["notes"])
    assert {p["state"] for p in out["patches"].values()} == {"present"}


def test_a_lock_given_by_url_must_describe_the_installed_patched_tree(site, tmp_path):
    good = (ROOT / "locks" / "vllm.toml").read_text()
    pin = site["pin"]
    with serve() as idx:
        idx.pages["/vllm.toml"] = ("text/plain", good.encode())
        idx.pages["/other.toml"] = ("text/plain", good.replace(pin.patched_tree, "0" * 40).encode())
        rc, out = _status(site, tmp_path, "--lock", f"{idx.url}/vllm.toml")
        assert rc == 0 and any("describes the same patched tree" in n for n in out["notes"])
        rc, out = _status(site, tmp_path, "--lock", f"{idx.url}/other.toml")
        assert rc == 1 and any("(another patch series)" in n for n in out["notes"])
