"""tests/gpu/e2e/pack.py: the H200 dependency wheels tests/gpu/selftest_pack.py packs, on CPU.

What selftest_pack.py takes from pack.py is checked with real wheels made here
and the real pip: the cache lookup finds a wheel under its normalised name, a
wheel rewritten uncompressed without its ``DEP_STRIP`` members (RECORD fixed)
still installs with ``pip install --target``, pieces reassemble to the same
bytes, and ``DEPS`` is exactly the set ``wheels.lock.json`` records.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

E2E = Path(__file__).resolve().parent / "gpu" / "e2e"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("e2e_pack", E2E / "pack.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


pack = _load()


def test_pieces_reassemble(tmp_path: Path) -> None:
    blob = tmp_path / "x.xz"
    data = bytes(range(256)) * 1000
    blob.write_bytes(data)
    parts = pack.write_parts(blob, tmp_path, 10_000)
    assert len(parts) == -(-len(data) // 10_000)
    joined = b"".join((tmp_path / p["name"]).read_bytes() for p in parts)
    assert joined == data


@pytest.mark.parametrize("req", ["tilelang==0.1.9", "nvidia-cutlass-dsl-libs-cu13==4.6.0"])
def test_cached_wheel_lookup_normalises_names(tmp_path: Path, req: str) -> None:
    name, version = req.split("==")
    fn = f"{name.replace('-', '_')}-{version}-cp312-cp312-manylinux_2_28_x86_64.whl"
    (tmp_path / fn).write_bytes(b"")
    (tmp_path / f"{name.replace('-', '_')}-0.0.1-py3-none-any.whl").write_bytes(b"")
    assert pack._cached_wheel(tmp_path, req) == tmp_path / fn


def test_dependency_strip_patterns(tmp_path: Path) -> None:
    src = tmp_path / "z3_solver-4.15.4.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("z3/lib/libz3.so", b"lib")
        z.writestr("z3_solver-4.15.4.0.data/data/bin/z3", b"cli")
        z.writestr("z3_solver-4.15.4.0.dist-info/RECORD", "z3/lib/libz3.so,,\nz3_solver-4.15.4.0.data/data/bin/z3,,\n")
    dst = tmp_path / "o.whl"
    assert pack.restore_stored(src, dst, strip=True) == ["z3_solver-4.15.4.0.data/data/bin/z3"]
    with zipfile.ZipFile(dst) as z:
        assert z.namelist() == ["z3/lib/libz3.so", "z3_solver-4.15.4.0.dist-info/RECORD"]
        assert b"bin/z3" not in z.read("z3_solver-4.15.4.0.dist-info/RECORD")
    # a wheel without patterns passes through whole
    other = tmp_path / "cbor2-6.1.2-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("cbor2/__init__.py", b"")
    assert pack.restore_stored(other, tmp_path / "c.whl", strip=True) == []


def test_stripped_dependency_wheel_is_installable(tmp_path: Path) -> None:
    """As selftest_h200.sh installs them: ``pip install --no-index --no-deps --target`` of the stored wheel."""
    dist = "tilelang-0.1.9.dist-info"
    src = tmp_path / "tilelang-0.1.9-py3-none-any.whl"
    members = {
        "tilelang/__init__.py": b"VERSION = '0.1.9'\n",
        "tilelang/3rdparty/composable_kernel/include/ck.hpp": b"\0" * 100,
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: tilelang\nVersion: 0.1.9\n",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in members) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in members.items():
            z.writestr(n, d)
        z.writestr(f"{dist}/RECORD", record)
    dst = tmp_path / "out" / src.name
    dst.parent.mkdir()
    assert pack.restore_stored(src, dst, strip=True) == ["tilelang/3rdparty/composable_kernel/include/ck.hpp"]
    with zipfile.ZipFile(dst) as z:
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
        assert "composable_kernel" not in z.read(f"{dist}/RECORD").decode()
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                           str(target), str(dst)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (target / "tilelang" / "__init__.py").read_text() == "VERSION = '0.1.9'\n"
    assert not (target / "tilelang" / "3rdparty").exists()


def test_wheels_lock_records_exactly_deps() -> None:
    """selftest_pack.py refuses a wheel the lock does not record: DEPS and the lock must name the same set."""
    locked = [d["requirement"] for d in pack.load_lock()["deps"]]
    assert locked == [d.requirement for d in pack.DEPS]
    for rec in pack.load_lock()["deps"]:
        assert len(rec["sha256"]) == 64 and rec["size"] > 0
        assert pack._norm(rec["filename"].split("-")[0]) == pack._norm(rec["requirement"].split("==")[0])
