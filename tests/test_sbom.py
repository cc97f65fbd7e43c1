"""The CycloneDX SBOM in the patched vLLM 0.27.1 wheel (dsv4patch/delivery/sbom.py), on the real wheel.

The patched wheel is made from vLLM's real stock wheel (sha256 from the lock,
cached in the shared store) with a kernel library that ``dsv4patch build``
builds here against the CPU test venv's torch (objects cached in the store,
as in tests/test_vllm_wheel.py), twice, into two directories.  What is checked
is what an SBOM consumer relies on: the document sits where PEP 770 puts it
and RECORD lists it, it validates against the official CycloneDX 1.6 schema
(the copy cyclonedx-python-lib ships, offline, strict), it names the stock
wheel, the sdist and the commit with the lock's hashes, carries each applied
patch's text (hashing to the lock's sha256) with the pull request it
resolves, and the kernel library with the hash of the library in the wheel;
and two builds give the same bytes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from urllib.parse import quote

import pytest

from conftest import LOCK
from dsv4patch.delivery import sbom, vllm_wheel
from dsv4patch.main import main
from dsv4patch.pins import Context
from dsv4patch.pins.lock import load
from dsv4patch.progress import Progress
from dsv4patch.store import Store

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="needs nvcc")
pytestmark = [pytest.mark.slow, needs_nvcc]

PIN = "0.27.1"
KDIST = "dsv4patch_kernels_0_27_1"


def validate(text: str) -> object:
    """The official CycloneDX 1.6 JSON schema (strict), as cyclonedx-python-lib ships it: None when valid."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    return JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)


@pytest.fixture(scope="module")
def kernel_wheel(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Path:
    """The pin's kernel wheel, built by `dsv4patch build` on a tree made by `dsv4patch apply`."""
    base = tmp_path_factory.mktemp("kernels")
    tree = base / "tree"
    assert main(["apply", "--lock", str(LOCK), "--pin", PIN, "--tree", str(tree), "--cache-dir",
                 str(shared_cache), "--no-build", "--format", "json"]) == 0
    res = subprocess.run([sys.executable, "-m", "dsv4patch", "build", "--lock", str(LOCK), "--pin", PIN,
                          "--tree", str(tree), "--out", str(base / "dist"),
                          "--cache-dir", str(shared_cache), "--format", "json"],
                         capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    shutil.rmtree(tree)  # disk: the wheel is all that is used from here on
    (wheel,) = (base / "dist").glob(f"{KDIST}-*.whl")
    return wheel


def make_patched(base: Path, shared_cache: Path, kernel_wheel: Path, dirs: tuple[str, ...]) -> dict:
    """The patched wheel (make_wheel with --kernels), built once into each of ``base/DIR``."""
    lock = load(LOCK)
    pin = lock.pin(PIN)
    store = Store.open(shared_cache)
    ctx = Context(lock=lock, store=store, progress=Progress(False))
    wheels = {d: vllm_wheel.make_wheel(ctx=ctx, pin=pin, out=base / d,
                                       kernels=kernel_wheel) for d in dirs}
    return {**wheels, "pin": pin, "lock": lock}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path, kernel_wheel: Path) -> dict:
    """The patched wheel, built twice into two directories (a and b: the same bytes)."""
    return make_patched(tmp_path_factory.mktemp("sbom-wheel"), shared_cache, kernel_wheel, ("a", "b"))


def _member(wheel: Path, name: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name)


def test_sbom_sits_where_pep_770_puts_it_and_record_lists_it(built: dict) -> None:
    w = built["a"].built
    info = f"vllm-{w.version}.dist-info"
    assert w.sbom == f"{info}/sboms/dsv4patch.cdx.json" and w.sbom_size > 0
    listing = subprocess.run(["unzip", "-l", str(w.path)], capture_output=True, text=True, check=True).stdout
    assert f"{info}/sboms/dsv4patch.cdx.json" in listing
    assert vllm_wheel.check_record(w.path) == []  # every member, the SBOM included, with its hash and size
    with zipfile.ZipFile(w.path) as zf:
        assert zf.getinfo(w.sbom).file_size == w.sbom_size
        record = zf.read(f"{info}/RECORD").decode()
    assert f"\n{w.sbom},sha256=" in record


def test_sbom_validates_against_the_cyclonedx_1_6_schema(built: dict) -> None:
    w = built["a"].built
    text = _member(w.path, w.sbom).decode()
    assert validate(text) is None
    doc = json.loads(text)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    # The schema is enforced, not skipped: the same document with one wrong value fails it.
    bad = copy.deepcopy(doc)
    bad["metadata"]["component"]["pedigree"]["patches"][0]["type"] = "hotfix"
    assert validate(json.dumps(bad)) is not None
    bad = copy.deepcopy(doc)
    bad["components"][0]["hashes"][0]["content"] = "not-a-hash"
    assert validate(json.dumps(bad)) is not None


def test_sbom_names_the_ancestors_patches_and_kernel_library(built: dict) -> None:
    made, pin = built["a"], built["pin"]
    w = made.built
    doc = json.loads(_member(w.path, w.sbom))
    vllm = doc["metadata"]["component"]
    assert vllm["name"] == "vllm" and vllm["version"] == w.version
    assert vllm["purl"] == f"pkg:pypi/vllm@{quote(w.version, safe='')}"
    assert w.version.startswith("0.27.1+dsv4.") and "%2B" in vllm["purl"]
    ped = vllm["pedigree"]
    ancestors = {a["bom-ref"]: a for a in ped["ancestors"]}
    assert ancestors["stock-wheel"]["hashes"] == [{"alg": "SHA-256", "content": pin.wheels["x86_64"].sha256}]
    assert ancestors["stock-wheel"]["purl"].endswith("file_name=vllm-0.27.1-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert ancestors["sdist"]["hashes"] == [{"alg": "SHA-256", "content": pin.source.sha256}]
    assert ancestors["sdist"]["purl"] == "pkg:pypi/vllm@0.27.1?file_name=vllm-0.27.1.tar.gz"
    assert ped["commits"] == [{"uid": pin.commit, "url": f"https://github.com/vllm-project/vllm/commit/{pin.commit}"}]
    # One pedigree patch per applied patch; its text is the patch file the lock hashes.
    applied = [p for p in made.tree.series.patches if p.name in made.tree.patch_files]
    assert len(applied) >= 9 and len(ped["patches"]) == len(applied)
    by_hash = {hashlib.sha256(p["diff"]["text"]["content"].encode()).hexdigest(): p for p in ped["patches"]}
    assert set(by_hash) == {p.sha256 for p in applied}
    for p in applied:
        cdx = by_hash[p.sha256]
        (issue,) = cdx["resolves"]
        if not p.trailers["Origin"][0].startswith("none"):  # the seven fixes: backports of #51538
            assert cdx["type"] == "backport" and issue["id"] == "vllm-project/vllm#51538"
            assert issue["references"] == ["https://github.com/vllm-project/vllm/pull/51538"]
        else:  # the extras have no upstream pull request ("Origin: none")
            assert cdx["type"] == "unofficial" and issue["id"] == f"dsv4patch:{p.trailers['Fix'][0]}"
            assert "references" not in issue
        assert issue["type"] == "defect" and issue["name"] == p.subject.splitlines()[0]
    props = [(q["name"], q["value"]) for q in vllm["properties"]]
    assert ("dsv4patch:patch_set_sha256", made.tree.series.hash()) in props
    assert [v for n, v in props if n == "dsv4patch:patch"] == [f"{p.name} sha256:{p.sha256}" for p in applied]
    # The kernel library: the library file in the wheel, with its archs, torch and nvcc's CUDA.
    (kern,) = doc["components"]
    info = json.loads(_member(w.path, f"{KDIST}/build_info.json"))
    lib = _member(w.path, f"{KDIST}/{info['library']}")
    assert kern["name"] == KDIST and kern["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(lib).hexdigest()}]
    kp = dict((q["name"], q["value"]) for q in kern["properties"] if q["name"] != "dsv4patch:kernels:op")
    assert kp["dsv4patch:kernels:archs"] == " ".join(info["archs"])
    assert kp["dsv4patch:kernels:torch_version"] == info["torch_version"] == "2.13.0"
    assert kp["dsv4patch:kernels:nvcc_cuda_version"] == info["cuda_version"]
    assert kp["dsv4patch:kernels:tree_id"] == pin.patched_tree
    assert w.version.endswith(".k" + kp["dsv4patch:kernels:package_sha256"][:12])
    assert {"ref": "vllm", "dependsOn": ["kernels"]} in doc["dependencies"]


def test_sbom_is_byte_reproducible(built: dict) -> None:
    a, b = built["a"].built, built["b"].built
    assert a.path.parent != b.path.parent
    doc_a, doc_b = _member(a.path, a.sbom), _member(b.path, b.sbom)
    assert doc_a == doc_b
    doc = json.loads(doc_a)
    assert "timestamp" not in doc["metadata"]
    # The serial number is derived from the content: a zero serial in the draft, then uuid5 of its hash.
    draft = doc_a.decode().replace(doc["serialNumber"], "urn:uuid:00000000-0000-0000-0000-000000000000")
    import uuid

    assert doc["serialNumber"] == "urn:uuid:" + str(uuid.uuid5(sbom._SERIAL_NS,
                                                               hashlib.sha256(draft.encode()).hexdigest()))


def test_read_gives_the_facts_status_checks_and_survives_bad_documents(built: dict) -> None:
    made = built["a"]
    w = made.built
    facts = sbom.read(json.loads(_member(w.path, w.sbom)))
    assert facts.problems == [] and facts.version == w.version and facts.pin == PIN
    assert facts.patch_set_sha256 == made.tree.series.hash()
    assert sorted(facts.diff_sha256) == sorted(facts.patches.values())
    assert facts.kernel_package_sha256 is not None and w.version.endswith(facts.kernel_package_sha256[:12])
    for doc in (None, [], {"bomFormat": "SPDX"}, {"bomFormat": "CycloneDX", "metadata": "x"},
                {"bomFormat": "CycloneDX", "specVersion": "1.6",
                 "metadata": {"component": {"version": 1, "properties": "x",
                                            "pedigree": {"patches": [1, {"diff": "x"},
                                                                     {"diff": {"text": {"content": "@@",
                                                                                        "encoding": "base64"}}}]}}},
                 "components": [{"bom-ref": "kernels", "hashes": "x"}]}):
        got = sbom.read(doc)
        assert got.problems and got.kernel_library_sha256 is None
