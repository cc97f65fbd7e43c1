"""``dsv4patch wheel`` with the real vLLM 0.27.1 stock wheel from PyPI (sha256 from the lock).

The stock wheel (313 MB) is downloaded once into the shared store; the
kernel library is built by ``dsv4patch build`` against the CPU test venv's
torch (as tests/test_kernels.py does; objects cached in the store).  What is
checked is what an operator relies on: the wheel installs with plain pip, the
installed files are the patched tree's, pip reports the local version,
RECORD is right, two builds are byte-identical, and the wheel differs from
the stock one only in the patched files, the kernel package (with the hook
line in ``vllm/__init__.py``) and the metadata.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import LOCK, ROOT
from dsv4patch import hashing, zipcopy
from dsv4patch.delivery import vllm_wheel
from dsv4patch.errors import EXIT_FETCH, BuildError, IntegrityError
from dsv4patch.kernels import stock, wheelcache
from dsv4patch.kernels.identity import hook_line
from dsv4patch.pins import Context
from dsv4patch.pins.lock import load
from dsv4patch.progress import Progress
from dsv4patch.series.pincheck import patched_tree
from dsv4patch.store import Store

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="needs nvcc")
pytestmark = [pytest.mark.slow, needs_nvcc]

PIN = "0.27.1"
KDIST = "dsv4patch_kernels_0_27_1"


def _conforms(command: str, data: dict) -> None:
    """The JSON contract of issue 13: schemas/<command>.schema.json."""
    import jsonschema

    schema = json.loads((ROOT / "schemas" / f"{command}.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    assert data["schema_version"] == 1


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> dict:
    """The patched wheel, built twice into two directories, with the lock's toolchain as the
    card's ``apply`` builds (no --python): the kernel objects are the ones it compiled."""
    base = tmp_path_factory.mktemp("wheel")
    reports = []
    for d in ("a", "b"):
        out = base / "out.json"
        with open(out, "w") as fh:
            res = subprocess.run(
                [sys.executable, "-m", "dsv4patch", "wheel", "--lock", str(LOCK), "--pin", PIN,
                 "--out", str(base / d), "--cache-dir", str(shared_cache),
                 "--format", "json"], stdout=fh, stderr=subprocess.PIPE, text=True, timeout=1800)
        assert res.returncode == 0, res.stderr[-3000:]
        reports.append(json.loads(out.read_text()))
        _conforms("wheel", reports[-1])
    store = Store.open(shared_cache)
    lock = load(LOCK)
    pin = lock.pin(PIN)
    tree = patched_tree(ctx=Context(lock=lock, store=store, progress=Progress(False)), pin=pin)
    stock_path = stock.wheel_path(store, stock.wheel_for(pin, "x86_64"))
    return {"a": Path(reports[0]["wheel"]), "b": Path(reports[1]["wheel"]), "report": reports[0],
            "tree": tree, "stock": stock_path, "pin": pin, "base": base}


def test_two_builds_identical_and_named_with_local_version(wheels: dict) -> None:
    a, b = wheels["a"], wheels["b"]
    assert a.parent != b.parent and a.read_bytes() == b.read_bytes()
    series_hash = wheels["tree"].series.hash()
    # The label covers the patch set and the kernel package (library, build info, runtime).
    with zipfile.ZipFile(a) as zf:
        kmembers = {n: zf.read(n) for n in zf.namelist() if n.startswith("dsv4patch_kernels_0_27_1/")}
    assert kmembers
    version = f"0.27.1+dsv4.{series_hash[:12]}.k{vllm_wheel.kernels_hash(kmembers)[:12]}"
    assert version == wheels["report"]["version"]
    assert a.name == f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert vllm_wheel.check_record(a) == []
    with zipfile.ZipFile(a) as zf:
        assert zf.testzip() is None
        info = f"vllm-{version}.dist-info"
        meta = zf.read(f"{info}/METADATA").decode()
        assert f"\nVersion: {version}\n" in meta
        prov = json.loads(zf.read(f"{info}/dsv4patch.json"))
        names = zf.namelist()
    assert names[-1] == f"{info}/RECORD"
    assert prov["pin"] == PIN and prov["patch_set_sha256"] == series_hash
    assert prov["patched_tree"] == wheels["pin"].patched_tree
    assert prov["stock_wheel"]["sha256"] == wheels["pin"].wheels["x86_64"].sha256
    assert set(prov["patches"]) == {p.name for p in wheels["tree"].series.patches}


def test_differs_from_stock_only_in_patched_files_kernels_and_metadata(wheels: dict) -> None:
    tree = wheels["tree"]
    patched = {f.path: f for f in tree.files if f.path.startswith("vllm/")}
    assert len(patched) >= 10  # the Python files of fixes 1-6
    with open(wheels["stock"], "rb") as sfh, open(wheels["a"], "rb") as nfh:
        s_infos = {i.filename: i for i in zipcopy.open_members(wheels["stock"])}
        n_infos = {i.filename: i for i in zipcopy.open_members(wheels["a"])}
        old_info = "vllm-0.27.1.dist-info/"
        new_info = next(n.split("/")[0] + "/" for n in n_infos if n.endswith(".dist-info/RECORD"))
        renamed = {(new_info + n[len(old_info):] if n.startswith(old_info) else n): n for n in s_infos}
        added = set(n_infos) - set(renamed)
        assert added == {f"{KDIST}/__init__.py", f"{KDIST}/__main__.py", f"{KDIST}/build_info.json",
                         f"{KDIST}/libdsv4patch_kernels.so", new_info + "dsv4patch.json",
                         new_info + "sboms/dsv4patch.cdx.json"}
        assert set(renamed) <= set(n_infos)  # nothing removed
        differing = set()
        for new, old in renamed.items():
            s = zipcopy.read_raw(sfh, s_infos[old])
            n = zipcopy.read_raw(nfh, n_infos[new])
            if (s.data, s.crc, s.size) != (n.data, n.crc, n.size):
                differing.add(new)
                if new in patched:
                    assert zipcopy.inflate(s) == patched[new].base
                    assert zipcopy.inflate(n) == patched[new].patched
        assert differing == set(patched) | {"vllm/__init__.py", new_info + "METADATA", new_info + "RECORD"}
        init = zipcopy.inflate(zipcopy.read_raw(nfh, n_infos["vllm/__init__.py"]))
        stock_init = zipcopy.inflate(zipcopy.read_raw(sfh, s_infos["vllm/__init__.py"]))
        assert init == stock_init + hook_line(KDIST).encode()


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def installed(wheels: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The patched wheel installed with plain pip (--no-deps) into a fresh venv."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    res = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheels["a"])],
                         capture_output=True, text=True, env=_clean_env(), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                               capture_output=True, text=True, env=_clean_env(), check=True).stdout.strip())
    return {"python": py, "site": site}


def test_pip_installs_it_and_installed_files_are_the_patched_tree(wheels: dict, installed: dict) -> None:
    py, site, env = installed["python"], installed["site"], _clean_env()
    show = subprocess.run([py, "-m", "pip", "show", "vllm"], capture_output=True, text=True, env=env)
    series_hash = wheels["tree"].series.hash()
    assert any(line.startswith(f"Version: 0.27.1+dsv4.{series_hash[:12]}.k")
               for line in show.stdout.splitlines())
    for f in wheels["tree"].files:
        if f.path.startswith("vllm/"):
            assert _sha((site / f.path).read_bytes()) == _sha(f.patched), f.path
    # Every file pip installed hashes as the installed RECORD says.
    info = next(site.glob("vllm-0.27.1+dsv4.*.dist-info"))
    rows = [r for r in csv.reader((info / "RECORD").read_text().splitlines()) if r and r[1]]
    assert len(rows) > 4000
    for path, h, size in rows:
        data = (site / path).read_bytes()
        assert hashing.record_hash(data) == h and str(len(data)) == size, path
    # The kernel package's runtime sees its hook in the installed vllm/__init__.py.
    res = subprocess.run([py, "-c", f"import {KDIST} as k; print(k.hook_installed(), k.BUILD_INFO['tree_id'])"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", wheels["pin"].patched_tree]


def test_refuses_a_stock_wheel_that_differs_from_the_source_tree(wheels: dict, tmp_path: Path) -> None:
    """The stock wheel's copy of a file to patch must be the pin's unpatched file."""
    tree = wheels["tree"]
    target = "vllm/v1/worker/workspace.py"
    with zipfile.ZipFile(wheels["stock"]) as zf:
        record = zf.read("vllm-0.27.1.dist-info/RECORD")
        data = zf.read(target)
    fake = tmp_path / "vllm-0.27.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr(target, data + b"# a local edit\n")
        zf.writestr("vllm-0.27.1.dist-info/RECORD", record)
    with pytest.raises(IntegrityError) as exc:
        vllm_wheel.build(tree, fake, wheels["pin"].wheels["x86_64"], None, tmp_path / "out")
    assert exc.value.exit_code == EXIT_FETCH
    assert target in str(exc.value) and "pin 0.27.1" in str(exc.value)
    assert not list((tmp_path / "out").glob("*.whl")) and not list((tmp_path / "out").iterdir())


def test_kernel_wheel_of_another_platform_or_tree_is_refused(wheels: dict, tmp_path: Path) -> None:
    pin = wheels["pin"]
    plugin = tmp_path / f"{KDIST}-0.27.1+tree000-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(plugin, "w") as zf:
        zf.writestr(f"{KDIST}/build_info.json", json.dumps(
            {"tree_id": "0" * 40, "vllm_version": "0.27.1", "library": "libdsv4patch_kernels.so"}))
        zf.writestr(f"{KDIST}/libdsv4patch_kernels.so", b"x")
    with pytest.raises(BuildError, match="built for x86_64, the wheel is for aarch64"):
        vllm_wheel.read_kernels(plugin, pin, pin.patched_tree, "aarch64")
    with pytest.raises(BuildError, match="built from tree 0000"):
        vllm_wheel.read_kernels(plugin, pin, pin.patched_tree, "x86_64")


def _status(cli, shared_cache: Path, *args: str):
    return cli("status", "--installed", "--lock", LOCK, "--cache-dir", shared_cache, *args)


def test_status_installed_all_present(cli, installed: dict, wheels: dict, shared_cache: Path) -> None:
    res = _status(cli, shared_cache, "--python", installed["python"], "--format", "json")
    assert res.rc == 0, res.out[-3000:]
    rep = json.loads(res.out)
    _conforms("status", rep)
    assert rep["ok"] and rep["pin"] == PIN and rep["patched_tree"] == wheels["pin"].patched_tree
    assert {n: p["state"] for n, p in rep["patches"].items()} == {
        p.name: "present" for p in wheels["tree"].series.patches}
    assert rep["installed"]["version"].startswith("0.27.1+dsv4.")
    assert rep["installed"]["provenance"]["patched_tree"] == wheels["pin"].patched_tree
    k = rep["kernels"]
    assert k["ok"] and k["routes"] == {"vllm-hook": True, "entry-point": False}
    assert {u["unit"] for u in k["units"]} == {"csrc/libtorch_stable/topk.cu",
                                              "csrc/libtorch_stable/cooperative_topk.cu"}
    assert k["active"] == {"checked": False, "active": None, "reason": "no GPU on this machine"} or (
        k["active"]["checked"] and k["active"]["active"])
    text = _status(cli, shared_cache, "--python", installed["python"])
    assert text.rc == 0 and "everything matches the lock" in text.out
    assert "the engine was not run: `dsv4patch selftest`" in text.out  # status points to the node check
    assert "active: not checked (no GPU on this machine)" in text.out or "active: True" in text.out


def test_status_installed_names_the_patch_and_file_that_differ(cli, installed: dict, wheels: dict,
                                                             shared_cache: Path) -> None:
    """A stock file in place of a patched one exits 1 and names patch and file; so do an
    edited file (with a diff summary) and a deleted one."""
    site = installed["site"]
    target = site / "vllm" / "v1" / "worker" / "workspace.py"
    edited = site / "vllm" / "utils" / "flashinfer.py"
    saved = {p: p.read_bytes() for p in (target, edited)}
    with zipfile.ZipFile(wheels["stock"]) as zf:
        stock_bytes = zf.read("vllm/v1/worker/workspace.py")
    fix2 = "0002-DSV4-fix-2-Give-the-DSpark-draft-its-own-workspace-l.patch"
    fix5 = "0005-DSV4-fix-5-Refuse-unsupported-SM120-sparse-MLA-confi.patch"
    try:
        target.write_bytes(stock_bytes)
        res = _status(cli, shared_cache, "--python", installed["python"])
        assert res.rc == 1
        assert fix2[:40] in res.out and "vllm/v1/worker/workspace.py: stock" in res.out
        rep = json.loads(_status(cli, shared_cache, "--python", installed["python"], "--format", "json").out)
        assert not rep["ok"]
        bad = {n: p for n, p in rep["patches"].items() if p["state"] != "present"}
        assert list(bad) == [fix2] and bad[fix2]["state"] == "stock"
        assert bad[fix2]["files"]["vllm/v1/worker/workspace.py"] == {"state": "stock"}
        edited.write_bytes(saved[edited] + b"# local edit\n")
        target.unlink()
        rep = json.loads(_status(cli, shared_cache, "--python", installed["python"], "--format", "json").out)
        assert rep["patches"][fix2]["state"] == "missing"
        f = rep["patches"][fix5]["files"]["vllm/utils/flashinfer.py"]
        assert rep["patches"][fix5]["state"] == "other" and f["diff"].startswith("+1 -0 lines")
    finally:
        for p, data in saved.items():
            p.write_bytes(data)
    assert _status(cli, shared_cache, "--python", installed["python"]).rc == 0


def test_status_installed_without_vllm_or_with_tree(cli, tmp_path: Path, shared_cache: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Away from any ./vllm-src (CI's main job makes one in the checkout): status without
    # --tree then has nothing to take.
    monkeypatch.chdir(tmp_path)
    venv = tmp_path / "empty"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    res = _status(cli, shared_cache, "--python", venv / "bin" / "python", "--format", "json")
    assert res.rc == 1 and json.loads(res.out)["installed"] is None
    text = _status(cli, shared_cache, "--python", venv / "bin" / "python").out
    # Said once, no empty table, no unknown tree shown as "?".
    assert text.count("not installed") == 1 and "vLLM is not installed in" in text, text
    # and the step that names the vLLM environment's interpreter, as a command to copy
    assert "dsv4patch status --installed --python PYTHON" in text and "DSV4PATCH_VLLM_PYTHON" in text, text
    assert "patched tree ?" not in text and "files not present" not in text, text
    assert _status(cli, shared_cache, "--tree", tmp_path).rc == 2
    # status without --tree takes the lock's project's vllm-src/<pin> (issue 40: relative defaults from the
    # lock's project root, wherever it runs; CI's main job makes one in the checkout): a project without one
    # has nothing to take.
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "patches", proj / "patches")
    (proj / "locks").mkdir()
    shutil.copyfile(LOCK, proj / "locks" / "vllm.toml")
    res = cli("status", "--lock", proj / "locks" / "vllm.toml")
    assert res.rc == 2 and str(proj / "vllm-src") in res.err, res.out + res.err
    assert _status(cli, shared_cache, "--python", tmp_path / "nope").rc == 2


def test_other_platform_needs_a_kernel_wheel_built_there(cli, shared_cache: Path, tmp_path: Path) -> None:
    res = cli("wheel", "--lock", LOCK, "--pin", PIN, "--platform", "aarch64", "--out", tmp_path,
              "--cache-dir", shared_cache)
    host = "aarch64" if os.uname().machine in ("aarch64", "arm64") else "x86_64"
    if host == "x86_64":
        assert res.rc == 2 and "build it on a aarch64 machine" in res.err and "--kernels" in res.err
        assert not list(tmp_path.iterdir())


def test_partial_wheels_of_killed_runs_are_swept_from_out(tmp_path: Path) -> None:
    """Issue 36: a killed `wheel` left `dist/.vllm-...whl.tmp<pid>` (60 MB) that no later run removed.

    Now the partial wheel is an owned file (swept once its writer is dead, never while it lives);
    the older naming is swept when its pid is gone."""
    import signal

    out = tmp_path / "dist"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    legacy = out / f".vllm-0.27.1+dsv4.x-cp38-abi3-manylinux_2_28_x86_64.whl.tmp{dead.pid}"
    legacy.write_bytes(b"x" * 1000)
    alive = out / f".vllm-0.27.1+dsv4.x-cp38-abi3-manylinux_2_28_x86_64.whl.tmp{os.getpid()}"
    alive.write_bytes(b"x")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom dsv4patch import safeio\n"
                               f"fd, p = safeio.create_owned(Path({str(out)!r}), 'vllm.whl')\nprint(p, flush=True)\n"
                               "time.sleep(300)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    partial = Path(holder.stdout.readline().strip())
    try:
        assert vllm_wheel.sweep_out(out) == [legacy]
        assert partial.exists() and alive.exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert vllm_wheel.sweep_out(out) == [partial]
    assert sorted(p.name for p in out.iterdir()) == [alive.name]


def test_status_installed_says_each_cause_once_and_the_right_next_step(cli, installed: dict, wheels: dict,
                                                                       shared_cache: Path) -> None:
    """issue 40: a stock install repeated the same `next:` line for every patch and said "install the
    patched wheel again" where none was ever installed. Two patches' files put back to stock: one line
    for the cause naming both, one next step; without dsv4patch's provenance file (vLLM's own wheel,
    as far as the files say) the next step is to install the patched wheel, not "again"."""
    site = installed["site"]
    paths = ["vllm/v1/worker/workspace.py", "vllm/utils/flashinfer.py"]
    saved = {p: (site / p).read_bytes() for p in paths}
    (prov,) = site.glob("vllm-*.dist-info/dsv4patch.json")
    saved_prov = prov.read_bytes()
    try:
        with zipfile.ZipFile(wheels["stock"]) as zf:
            for p in paths:
                (site / p).write_bytes(zf.read(p))
        res = _status(cli, shared_cache, "--python", installed["python"])
        assert res.rc == 1
        nexts = [line for line in res.out.splitlines() if line.strip().startswith("next:")]
        stock = [line for line in res.out.splitlines() if line.startswith("stock (")]
        assert len(stock) == 1 and "0002 (vllm/v1/worker/workspace.py: stock)" in stock[0] and "0005 (" in stock[0]
        assert len(nexts) == 1 and "install the patched wheel again" in nexts[0], res.out
        prov.unlink()
        res = _status(cli, shared_cache, "--python", installed["python"])
        nexts = [line for line in res.out.splitlines() if line.strip().startswith("next:")]
        assert len(nexts) == 1 and "again" not in nexts[0] and "install the patched wheel" in nexts[0], res.out
    finally:
        for p, data in saved.items():
            (site / p).write_bytes(data)
        prov.write_bytes(saved_prov)
    assert _status(cli, shared_cache, "--python", installed["python"]).rc == 0


def test_wheel_table_keeps_words_whole(cli, wheels: dict, shared_cache: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 40: the wheel command's table at 80 columns (the command through its entry point,
    COLUMNS=80, output piped) and the same table at 100: no cell splits a word."""
    from test_terminal import assert_no_word_split, run_at

    rc, out, (table,) = run_at(cli, monkeypatch, 80, "wheel", "--lock", LOCK, "--pin", PIN, "--out",
                               wheels["base"] / "c", "--cache-dir", shared_cache)
    assert rc == 0, out
    assert_no_word_split(table, 80, out)
    assert_no_word_split(table, 100)


def test_a_warm_wheel_reads_the_kept_kernel_wheel_and_a_changed_cache_tree_is_made_again(
        wheels: dict, shared_cache: Path) -> None:
    """The kernel wheel the first build made is kept in the cache (kernels/wheelcache.py) and a warm
    wheel reads it: the cache's patched tree is neither read nor vetted (a kernel source changed
    there, here one that would not compile, stays as it is), and the wheel is byte for byte the
    first one.  Without a kept wheel it builds in the cache's own tree without checking the series
    into it again, only while that tree is exactly the locked patched tree: the changed source
    sends it through apply again (made anew), the wheel is the same again, and it is kept anew."""
    tree = wheels["tree"]
    path = shared_cache / "wheel-trees" / f"{PIN}-{tree.patched_tree[:12]}-{tree.series.hash()[:12]}"
    held = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD^{tree}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert held == wheels["pin"].patched_tree
    store = Store.open(shared_cache)
    key = wheelcache.key(store=store, pin=wheels["pin"], patched_tree=tree.patched_tree, archs=None, nvcc=None,
                         progress=Progress(False))
    assert key is not None
    kept = wheelcache.kept(store, key)
    assert kept is not None and kept.name.startswith("dsv4patch_kernels_0_27_1-")
    source = path / next(f.path for f in tree.files if f.path.startswith("csrc/") and f.path.endswith(".cu"))
    source.write_bytes(source.read_bytes() + b"\n#error changed in the cache's tree\n")

    def wheel(out: Path) -> None:
        res = subprocess.run([sys.executable, "-m", "dsv4patch", "wheel", "--lock", str(LOCK), "--pin", PIN,
                              "--out", str(out), "--cache-dir", str(shared_cache)],
                             capture_output=True, text=True, timeout=1800)
        assert res.returncode == 0, res.stderr[-3000:]
        assert (out / wheels["a"].name).read_bytes() == wheels["a"].read_bytes()

    wheel(wheels["base"] / "c")
    assert source.read_bytes().endswith(b"#error changed in the cache's tree\n")  # not built, not made anew
    data = bytearray(kept.read_bytes())  # a damaged kept wheel is not read: the tree is built from
    data[len(data) // 2] ^= 0xFF
    kept.write_bytes(bytes(data))
    wheel(wheels["base"] / "d")
    assert b"#error changed" not in source.read_bytes()
    again = wheelcache.kept(store, key)
    assert again is not None and again.read_bytes() != bytes(data)
