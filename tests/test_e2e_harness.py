"""The end-to-end harness (tests/gpu/e2e) without a GPU: deadlines, oracle, packing.

The real run needs an H200 and vLLM 0.26.0; what can go wrong on the harness
side is checked here with fake children that speak the same progress
protocol: a hang must be cut at its deadline (the whole process group, child
processes included), a crash must carry its error, the oracle must name the
first differing token, and pack.py's stripped wheel must still be installable.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

E2E = Path(__file__).resolve().parent / "gpu" / "e2e"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"e2e_{name}", E2E / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


run_e2e = _load("run_e2e")
pack = _load("pack")
tiny = _load("make_tiny_dsv4")

FAKE_CHILD = textwrap.dedent(
    """
    import faulthandler, json, os, signal, subprocess, sys, time
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # as child_main does
    mode, progress = sys.argv[1], sys.argv[2]
    f = open(progress, "a", buffering=1)
    def emit(**kw):
        kw["t"] = time.time(); f.write(json.dumps(kw) + "\\n"); f.flush()
    emit(event="fingerprint", data={"vllm_version": "fake"})
    if mode == "hang-start":
        time.sleep(60)
    emit(event="engine_ready", scaled_params=0)
    # a grandchild in the same process group, as vLLM's engine core is
    gc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(progress + ".gc", "w").write(str(gc.pid))
    toks = {"short_b1": [[5, 6, 7]], "short_b5": [[1, 2], [3, 4]]}
    for case in ("short_b1", "short_b5"):
        emit(event="case_start", case=case)
        if mode == "hang" and case == "short_b5":
            time.sleep(60)
        if mode == "crash" and case == "short_b5":
            print("RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
            os._exit(3)
        t = toks[case]
        if mode == "differ" and case == "short_b5":
            t = [[1, 2], [3, 9]]
        emit(event="case_done", case=case, tokens=t, gaps=[[0.5] * len(r) for r in t], seconds=0.1)
    if mode == "score":
        emit(event="score_start", source="mtp1", case="short_b5")
        emit(event="score_done", source="mtp1", case="short_b5", worst=[[0.25, 1], [0.0, -1]])
    gc.kill()
    emit(event="child_done")
    """
)


def _run(tmp_path: Path, mode: str, method: str = "mtp1", hang_probe_s: float = 0.0) -> run_e2e.RunResult:
    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD)
    progress = tmp_path / f"{mode}.jsonl"
    return run_e2e.run_child(
        [sys.executable, str(script), mode, str(progress)],
        {"PATH": "/usr/bin:/bin"},
        progress,
        tmp_path / f"{mode}.log",
        ["short_b1", "short_b5", "long_b1"],
        start_deadline=3.0,
        case_deadline=2.0,
        variant="stock",
        method=method,
        poll=0.1,
        settle=0.2,
        hang_probe_s=hang_probe_s,
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_hang_in_a_case_kills_the_group_and_keeps_earlier_cases(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = _run(tmp_path, "hang")
    assert time.monotonic() - t0 < 15
    assert res.outcome == "hang"
    status = {c.case: c.status for c in res.cases}
    assert status == {"short_b1": "finished", "short_b5": "hang", "long_b1": "not-run"}
    assert "case short_b5" in res.cases[1].detail
    gc_pid = int((tmp_path / "hang.jsonl.gc").read_text())
    time.sleep(0.3)
    assert not _alive(gc_pid), "the engine-core-like grandchild survived the kill"


def test_a_hung_child_is_probed_before_the_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # cuda-gdb cannot run here (no GPU): a stand-in on PATH records how it is called
    # and answers as cuda-gdb does for a spinning kernel
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gdb = bin_dir / "cuda-gdb"
    gdb.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\n'
                   'echo "Kernel 0 persistent_topk_kernel<512, 4>(params) sm 3 running"\n')
    gdb.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    res = _run(tmp_path, "hang", hang_probe_s=10.0)
    assert res.outcome == "hang"
    log = (tmp_path / "hang.log").read_text()
    # the child's own Python stack, from its SIGUSR1 handler: where the host waits
    assert "hang probe: python stacks" in log
    stacks = log.split("hang probe: python stacks")[1].split("hang probe: cuda-gdb")[0]
    assert "most recent call first" in stacks and 'fake_child.py", line' in stacks
    # the kernel still on the GPU, named by cuda-gdb attached to the child
    assert "persistent_topk_kernel<512, 4>" in log
    args = (bin_dir / "args").read_text().split()
    assert args[args.index("-p") + 1].isdigit() and "info cuda kernels" in " ".join(args)


def test_no_probe_when_the_budget_cuts_a_child(tmp_path: Path) -> None:
    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD)
    progress = tmp_path / "cut.jsonl"
    res = run_e2e.run_child([sys.executable, str(script), "hang", str(progress)], {"PATH": "/usr/bin:/bin"},
                            progress, tmp_path / "cut.log", ["short_b1", "short_b5"], start_deadline=30.0,
                            case_deadline=30.0, variant="stock", method="mtp1", poll=0.1, settle=0.2,
                            hard_stop=time.monotonic() + 2.0, hang_probe_s=10.0)
    assert res.outcome == "cut"
    assert "hang probe" not in (tmp_path / "cut.log").read_text()


def test_tk120_needs_logits_wide_enough_to_split_a_row() -> None:
    # the hang input of the kernel proof (4 rows of 16,384; tests/gpu/run_vllm_binary_proof.py)
    # hung stock's kernel on the H200: two CTAs per row
    assert run_e2e.persistent_topk_ctas(16384, 4) == 2
    assert run_e2e.persistent_topk_ctas(16384, 8) == 2
    assert run_e2e.persistent_topk_ctas(16384, 16) == 1  # 227 KiB: one CTA holds the row
    assert run_e2e.persistent_topk_ctas(1024, 4) == 1
    assert run_e2e.tk120_problem(["plain", "mtp1-tk120"], 65536) is None
    assert run_e2e.tk120_problem(["plain", "mtp1"], 4096) is None  # no -tk120: any length
    msg = run_e2e.tk120_problem(["mtp1-tk120"], 4096)
    assert msg and "1024 wide" in msg
    with pytest.raises(SystemExit, match="cannot hang"):
        run_e2e.main(["--methods", "plain,mtp1-tk120", "--max-model-len", "4096", "--site", "stock=/x",
                      "--site", "patched=/y", "--out", "/tmp/never-written-e2e"])


def test_hang_at_engine_start(tmp_path: Path) -> None:
    res = _run(tmp_path, "hang-start")
    assert res.outcome == "hang"
    assert [c.status for c in res.cases] == ["hang", "not-run", "not-run"]
    assert res.cases[0].detail.startswith("engine start")


def test_crash_records_the_error_line(tmp_path: Path) -> None:
    res = _run(tmp_path, "crash")
    assert res.outcome == "crash"
    c = res.cases[1]
    assert c.status == "crash"
    assert "illegal memory access" in c.detail and "exit 3" in c.detail


def test_oracle_pass_and_first_difference(tmp_path: Path) -> None:
    plain = _run(tmp_path, "ok", method="plain")
    same = _run(tmp_path, "ok", method="mtp1")
    diff = _run(tmp_path, "differ", method="mtp2")
    runs = [plain, same, diff]
    run_e2e.apply_oracle(runs)
    assert [c.status for c in same.cases[:2]] == ["pass", "pass"]
    assert diff.cases[0].status == "pass"
    assert diff.cases[1].status == "differ"
    assert diff.cases[1].detail.startswith("first difference request 1 token 1;")
    assert "gap there 0.5" in diff.cases[1].detail
    md = run_e2e.render_markdown(runs, run_e2e.controls(runs), {})
    assert "| stock | mtp2 |" in md and "differ" in md


def test_report_merges_result_files(tmp_path: Path) -> None:
    plain = _run(tmp_path, "ok", method="plain")
    diff = _run(tmp_path, "differ", method="mtp2")
    ns = type("NS", (), dict(model="m", weights="scaled", long_len=1, case_deadline=1, start_deadline=1))
    run_e2e.write_results(tmp_path / "a", [plain], ns)
    run_e2e.write_results(tmp_path / "b", [diff], ns)
    # results are committed gzipped: the merge reads either form
    import gzip
    (tmp_path / "b/e2e_results.json.gz").write_bytes(gzip.compress((tmp_path / "b/e2e_results.json").read_bytes()))
    run_e2e.report_main(tmp_path / "m", [tmp_path / "a/e2e_results.json", tmp_path / "b/e2e_results.json.gz"])
    data = json.loads((tmp_path / "m/e2e_results.json").read_text())
    statuses = {(r["method"], c["case"]): c["status"] for r in data["runs"] for c in r["cases"]}
    assert statuses[("mtp2", "short_b5")] == "differ"
    assert statuses[("mtp2", "short_b1")] == "pass"


def test_report_merge_uses_the_plain_run_that_scored_each_method(tmp_path: Path) -> None:
    # two device calls: each has its own plain run, scoring its own speculative methods
    ns = type("NS", (), dict(model="m", weights="scaled", long_len=1, case_deadline=1, start_deadline=1))
    for call, method, worst in (("a", "mtp1", 3.0), ("b", "mtp2", 0.1)):
        plain = _run(tmp_path / call, "ok", method="plain") if (tmp_path / call).mkdir() is None else None
        plain.scores = {"plain": {"short_b5": [[0.2, 1], [0.1, 0]]}, method: {"short_b5": [[worst, 1], [0.0, -1]]}}
        run_e2e.write_results(tmp_path / call, [plain, _run(tmp_path / call, "differ", method=method)], ns)
    run_e2e.report_main(tmp_path / "m", [tmp_path / "a/e2e_results.json", tmp_path / "b/e2e_results.json"])
    data = json.loads((tmp_path / "m/e2e_results.json").read_text())
    statuses = {(r["method"], c["case"]): c["status"] for r in data["runs"] for c in r["cases"]}
    # mtp1 was scored only by call a's plain run (3.0 > tolerance 0.5): wrong, not "differ"
    assert statuses[("mtp1", "short_b5")] == "wrong"
    assert statuses[("mtp2", "short_b5")] == "noise"


def test_first_difference_lengths() -> None:
    fd = run_e2e.first_difference
    assert fd([[1, 2, 3]], [[1, 2, 3]]) is None
    assert fd([[1, 2, 3]], [[1, 2]]) == (0, 2)
    assert fd([[1], [2, 3]], [[1], [2, 4]]) == (1, 1)


def test_cases_cross_window_blocks_and_topk() -> None:
    cases = {c.name: c for c in run_e2e.build_cases()}
    # short prompts decode past the 128-token window and a 256-token block
    assert max(cases["short_b1"].max_tokens) + len(cases["short_b1"].prompts[0]) > 256
    # staggered lengths drain the batch
    assert len(set(cases["short_b5"].max_tokens)) == len(cases["short_b5"].prompts)
    # the long prompt has more C4-compressed rows than the indexer's top-k
    assert len(cases["long_b1"].prompts[0]) // 4 > tiny.INDEX_TOPK
    assert cases["long_b1"].prompts[0] == cases["long_b3"].prompts[0]
    # > 32 indexer decode rows even for MTP with one token (persistent_topk path)
    assert len(cases["short_b24"].prompts) * 2 > 32 >= len(cases["short_b5"].prompts) * 4
    # short_b24's shape, no prompt short enough to be scheduled as a decode (1 + k tokens, k <= 5)
    mid, short = cases["mid_b24"], cases["short_b24"]
    assert mid.max_tokens == short.max_tokens and len(mid.prompts) == len(short.prompts)
    assert min(map(len, mid.prompts)) > 1 + 5 and min(map(len, short.prompts)) <= 1 + 2
    # short_b24's first step (132 tokens, padded to MTP 2's 138) without a prompt MTP 2 takes for a decode;
    # and with decodes but a first step of exactly 138 tokens (an MTP 2 graph size: no padding rows)
    pf, nopad = cases["short_b24_pf"], cases["short_b24_nopad"]
    assert sum(map(len, pf.prompts)) == sum(map(len, short.prompts)) == 132 and min(map(len, pf.prompts)) > 1 + 2
    assert sum(map(len, nopad.prompts)) == 138 in run_e2e.bm_capture_sizes(2, requests=46)
    assert nopad.prompts[:-1] == short.prompts[:-1] and min(map(len, nopad.prompts)) <= 1 + 2
    assert pf.max_tokens == nopad.max_tokens == short.max_tokens
    for c in cases.values():
        for p, n in zip(c.prompts, c.max_tokens, strict=True):
            assert all(2 <= t < tiny.VOCAB_SIZE for t in p)
            assert len(p) + n <= 4096


def test_site_env_follows_pth_files(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "pkg_a" / "inner").mkdir(parents=True)
    (site / "dslpkg" / "dsl_packages").mkdir(parents=True)
    (site / "dslpkg" / "__init__.py").write_text("")
    (site / "x.pth").write_text("pkg_a/inner\n# comment\nmissing_dir\n")
    # nvidia-cutlass-dsl's form: an import line that edits sys.path
    (site / "y.pth").write_text(
        "import sys, os, dslpkg; sys.path.insert(0, os.path.join(dslpkg.__path__[0], 'dsl_packages'))\n"
    )
    env = run_e2e.site_env(site, {"PYTHONPATH": "/old", "PATH": "/usr/bin:/bin"})
    parts = env["PYTHONPATH"].split(":")
    assert parts[0] == str(site) and parts[-1] == "/old"
    assert str(site / "pkg_a" / "inner") in parts
    assert str(site / "dslpkg" / "dsl_packages") in parts
    assert not any("missing_dir" in p for p in parts)


def test_tiny_config_obeys_its_constraints(tmp_path: Path) -> None:
    cfg = tiny.tiny_config()
    assert tiny.check_config(cfg) == []
    bad = dict(cfg, head_dim=256)
    assert any("head_dim" in e for e in tiny.check_config(bad))
    bad = dict(cfg, compress_ratios=[0, 0, 0, 0, 0])
    assert any("C4" in e for e in tiny.check_config(bad))
    out = tiny.write_model(tmp_path / "m")
    assert json.loads((out / "config.json").read_text())["model_type"] == "deepseek_v4"
    # the diagnostic model: the same network without compressed layers, asked for by name
    assert tiny.main([str(tmp_path / "swa"), "--compress-ratios", "0,0,0,0,0"]) == 0
    swa = json.loads((tmp_path / "swa" / "config.json").read_text())
    assert swa["compress_ratios"] == [0, 0, 0, 0, 0] and swa["hidden_size"] == cfg["hidden_size"]
    with pytest.raises(SystemExit, match="one entry per layer"):
        tiny.main([str(tmp_path / "short"), "--compress-ratios", "0,0"])


def test_diagnostic_suffixes_parse_and_plain_r2_is_judged_like_a_speculative_run() -> None:
    assert run_e2e.split_method("mtp2-sync-eager-r2") == ("mtp2", {"sync", "eager", "r2"})
    plain, spec = run_e2e.schedule(["stock"], ["plain", "plain-r2", "mtp2", "mtp2-r2"])
    assert plain == [("stock", "plain")]
    assert spec == [("stock", "plain-r2"), ("stock", "mtp2"), ("stock", "mtp2-r2")]
    with pytest.raises(SystemExit, match="unknown method"):
        run_e2e.split_method("mtp2-fast")


def test_stripped_wheel_is_installable(tmp_path: Path) -> None:
    src = tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    members = {
        "vllm/__init__.py": b"__version__ = '0.26.0'\n",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"\0" * 100,
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"\1" * 100,
        "vllm/vllm-rs": b"\2" * 50,
        "vllm-0.26.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n",
        "vllm-0.26.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: false\nTag: cp38-abi3-manylinux_2_28_x86_64\n",
    }
    record = "".join(f"{n},," + "\n" for n in members) + "vllm-0.26.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in members.items():
            z.writestr(n, d)
        z.writestr("vllm-0.26.0.dist-info/RECORD", record)
    dst = tmp_path / "out" / src.name
    dst.parent.mkdir()
    dropped = pack.restore_stored(src, dst, strip=True)
    assert sorted(dropped) == ["vllm/vllm-rs", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]
    with zipfile.ZipFile(dst) as z:
        names = z.namelist()
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
        rec = z.read("vllm-0.26.0.dist-info/RECORD").decode()
    assert "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" in names
    assert "_vllm_fa2_C" not in rec and "vllm-rs" not in rec
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target), str(dst)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert (target / "vllm" / "vllm_flash_attn" / "_vllm_fa3_C.abi3.so").exists()
    assert not (target / "vllm" / "vllm-rs").exists()


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


def test_budget_cut_is_not_a_hang(tmp_path: Path) -> None:
    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD)
    progress = tmp_path / "cut.jsonl"
    res = run_e2e.run_child(
        [sys.executable, str(script), "hang-start", str(progress)],
        {"PATH": "/usr/bin:/bin"},
        progress,
        tmp_path / "cut.log",
        ["short_b1", "short_b5"],
        start_deadline=30.0,
        case_deadline=30.0,
        variant="stock",
        method="plain",
        hard_stop=time.monotonic() + 1.0,
        poll=0.1,
        settle=0.2,
    )
    assert res.outcome == "cut"
    assert [c.status for c in res.cases] == ["not-run", "not-run"]
    assert res.cases[0].detail.startswith("budget")


def _namespace_cutlass_site(root: Path, with_core: bool) -> Path:
    """A site shaped like nvidia-cutlass-dsl's: `cutlass` lives under a .pth-added dir.

    Without the libs-core part, `cutlass` is only a namespace package (as on the
    first device run) and `cutlass.cute` does not import.
    """
    site = root / "site"
    dsl = site / "nvdsl" / "dsl_packages" / "cutlass"
    (dsl / "_mlir").mkdir(parents=True)
    (site / "nvdsl" / "__init__.py").write_text("")
    (dsl / "_mlir" / "__init__.py").write_text("")
    (site / "nvdsl.pth").write_text(
        "import sys, os, nvdsl; sys.path.insert(0, os.path.join(nvdsl.__path__[0], 'dsl_packages'))\n"
    )
    if with_core:
        (dsl / "__init__.py").write_text("")
        (dsl / "cute").mkdir()
        (dsl / "cute" / "__init__.py").write_text("")
    (site / "brokenmod.py").write_text("raise RuntimeError('needs CUDA')\n")
    return site


def test_preflight_names_each_sites_problems(tmp_path: Path) -> None:
    good = _namespace_cutlass_site(tmp_path / "good", with_core=True)
    bad = _namespace_cutlass_site(tmp_path / "bad", with_core=False)
    problems, text = run_e2e.preflight({"stock": bad, "patched": good}, ["cutlass", "cutlass.cute"])
    assert problems["patched"] == []
    assert problems["stock"] == ["cutlass.cute: ModuleNotFoundError: No module named 'cutlass.cute'"]
    assert "[stock] import problems: [\"cutlass.cute: ModuleNotFoundError" in text
    assert "[patched] import problems: none" in text
    # any exception counts, not only ImportError
    problems, _ = run_e2e.preflight({"stock": good}, ["brokenmod"])
    assert problems["stock"] == ["brokenmod: RuntimeError: needs CUDA"]


def test_preflight_exit_code_and_file(tmp_path: Path) -> None:
    bad = _namespace_cutlass_site(tmp_path / "bad", with_core=False)
    good = _namespace_cutlass_site(tmp_path / "good", with_core=True)
    out = tmp_path / "out"
    argv = ["--preflight", "--out", str(out), "--preflight-modules", "cutlass,cutlass.cute"]
    assert run_e2e.main(argv + ["--site", f"stock={bad}", "--site", f"patched={good}"]) == 3
    assert "No module named 'cutlass.cute'" in (out / "preflight.txt").read_text()
    assert run_e2e.main(argv + ["--site", f"stock={good}"]) == 0


def _fake_payload(root: Path) -> Path:
    """.e2e/ with one piece holding one pure-Python wheel (package `fakepkg`), as pack.py lays it out."""
    import hashlib
    import io
    import lzma
    import tarfile

    def wheel(name: str, version: str, files: dict[str, str]) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for path, text in files.items():
                z.writestr(path, text)
            di = f"{name}-{version}.dist-info"
            z.writestr(f"{di}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
            z.writestr(f"{di}/WHEEL", "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            z.writestr(f"{di}/RECORD", "")
        return buf.getvalue()

    wheels = {
        "fakepkg-1.0-py3-none-any.whl": wheel("fakepkg", "1.0", {"fakepkg/__init__.py": ""}),
        # a stand-in vLLM with the vendored DeepGEMM device.sh moves to deps/
        "vllm-0.26.0-py3-none-any.whl": wheel("vllm", "0.26.0", {
            "vllm/__init__.py": "",
            "vllm/third_party/__init__.py": "",
            "vllm/third_party/deep_gemm/__init__.py": "WHERE = __file__\n",
        }),
    }
    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w") as tar:
        for name, data in wheels.items():
            info = tarfile.TarInfo(f"wheels/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = lzma.compress(tar_buf.getvalue())
    src = root / ".e2e"
    (src / "meta").mkdir(parents=True)
    (src / "part-01.bin").write_bytes(blob)
    sha = hashlib.sha256(blob).hexdigest()
    manifest = {"parts": [{"name": "part-01.bin", "size": len(blob), "sha256": sha}], "xz_sha256": sha}
    (src / "meta" / "manifest.json").write_text(json.dumps(manifest))
    return src


@pytest.mark.parametrize("modules, rc", [("fakepkg,fakepkg.missing", 3), ("fakepkg", 0)])
def test_device_sh_stops_before_engines_on_import_problems(tmp_path: Path, modules: str, rc: int) -> None:
    src = _fake_payload(tmp_path)
    out = tmp_path / "out"
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHON": sys.executable,
        "E2E_DIR": str(tmp_path / "e2e"),
        "E2E_SRC": str(src),
        "OUT": str(out),
        "E2E_PREFLIGHT_MODULES": modules,
    }
    # the run arguments would start engines (here: children that fail at once)
    args = ["--variants", "stock", "--methods", "plain", "--budget", "30", "--work", str(tmp_path / "work")]
    proc = subprocess.run(
        ["bash", str(E2E / "device.sh"), *(args if rc else ["--no-run"])],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == rc, proc.stdout + proc.stderr
    pre = (out / "preflight.txt").read_text()
    if rc:
        assert "fakepkg.missing: ModuleNotFoundError" in proc.stdout
        assert "stopping before the engines" in proc.stdout
        assert not (out / "run.txt").exists() and not (tmp_path / "work").exists()
        assert "[stock] import problems: [\"fakepkg.missing" in pre
    else:
        assert "[stock] import problems: none" in pre and "[patched] import problems: none" in pre
        assert "preflight ok" in proc.stdout
        # one shared deps dir (every JIT cache sees one path), vLLM alone per variant
        e2e = tmp_path / "e2e"
        assert (e2e / "deps/fakepkg").is_dir() and (e2e / "deps/deep_gemm/__init__.py").is_file()
        assert not (e2e / "deps/vllm").exists()
        for v in ("stock", "patched"):
            assert sorted(p.name for p in (e2e / f"vllm-{v}").iterdir()) == ["vllm", "vllm-0.26.0.dist-info"]
        env_p = run_e2e.site_env(f"{e2e}/vllm-patched{os.pathsep}{e2e}/deps", {"PATH": env["PATH"]})
        probe = "import deep_gemm, fakepkg, vllm; print(deep_gemm.WHERE); print(vllm.__file__)"
        got = subprocess.run([sys.executable, "-c", probe], env=env_p, capture_output=True, text=True,
                             check=True).stdout.split()
        assert got == [f"{e2e}/deps/deep_gemm/__init__.py", f"{e2e}/vllm-patched/vllm/__init__.py"]
        # a second call on the same machine, same pieces and meta: preflight remembered
        again = subprocess.run(["bash", str(E2E / "device.sh"), "--no-run"],
                               capture_output=True, text=True, env=env, timeout=300)
        assert again.returncode == 0 and "preflight: passed earlier" in again.stdout, again.stdout
        # changed meta (another patched tree): it runs again
        (src / "meta" / "note.txt").write_text("changed")
        third = subprocess.run(["bash", str(E2E / "device.sh"), "--no-run"],
                               capture_output=True, text=True, env=env, timeout=300)
        assert third.returncode == 0 and "preflight ok" in third.stdout, third.stdout
    if rc:
        assert not (tmp_path / "e2e" / "preflight.ok").exists()


def test_finalize_model_runs_each_classes_post_load_steps() -> None:
    """The harness loader must run what DeepSeek-V4's load_weights runs (run 2's assert)."""
    calls: list[str] = []

    class Inner:
        def finalize_mega_moe_weights(self) -> None:
            calls.append("inner.mega")

        def finalize_mhc_broadcast_weights(self) -> None:
            calls.append("inner.mhc")

    class Target:  # DeepseekV4ForCausalLM: steps on .model
        def __init__(self) -> None:
            self.model = Inner()

    class Mtp:  # DeepSeekV4MTP: its own finalize_mega_moe_weights
        def __init__(self) -> None:
            self.model = object()

        def finalize_mega_moe_weights(self) -> None:
            calls.append("mtp.mega")

    class Dspark:
        def __init__(self) -> None:
            self.model = object()

        def _finalize_moe(self) -> None:
            calls.append("dspark.moe")

    assert run_e2e.finalize_model(Target()) == [
        "Inner.finalize_mega_moe_weights", "Inner.finalize_mhc_broadcast_weights"]
    assert run_e2e.finalize_model(Mtp()) == ["Mtp.finalize_mega_moe_weights"]
    assert run_e2e.finalize_model(Dspark()) == ["Dspark._finalize_moe"]
    assert calls == ["inner.mega", "inner.mhc", "mtp.mega", "dspark.moe"]


def test_deficits_teacher_forced() -> None:
    # prompt of 2 tokens, then 3 generated: greedy, 0.75 below the best, unscored
    plp = [None, {7: -0.1}, {5: -0.2}, {6: -0.3, 9: -1.05}, {1: -0.5}]
    ds = run_e2e.deficits(2, [5, 9, 4], plp)
    assert ds[0] == 0.0 and abs(ds[1] - 0.75) < 1e-9 and ds[2] == float("inf")
    assert run_e2e.worst_deficit(ds) == [float("inf"), 2]
    assert run_e2e.worst_deficit([0.0, 0.25, 0.1]) == [0.25, 1]
    assert run_e2e.worst_deficit([]) == [0.0, -1]


def _run_result(method: str, tokens: list[list[int]], scores: dict | None = None) -> object:
    case = run_e2e.CaseResult("stock", method, "short_b5", "finished", "", 0.1, tokens,
                              [[0.5] * len(r) for r in tokens])
    return run_e2e.RunResult("stock", method, 1.0, None, "done", "", [case], scores or {})


def test_oracle_noise_or_wrong_from_plain_scores() -> None:
    """A differing speculative run is judged by how far its tokens are from plain's greedy choice."""
    self_score = {"short_b5": [[0.1, 3], [0.2, 7]]}  # plain's own tokens through prefill
    plain = _run_result("plain", [[1, 2, 3], [4, 5, 6]], {
        "plain": self_score,
        "mtp1": {"short_b5": [[0.0, -1], [0.3, 1]]},    # within 2 x 0.2 -> 0.5 (floor)
        "mtp2": {"short_b5": [[0.0, -1], [2.5, 1]]},    # far beyond: a wrong token
    })
    noise = _run_result("mtp1", [[1, 2, 3], [4, 8, 6]])
    wrong = _run_result("mtp2", [[1, 2, 3], [4, 8, 6]])
    unscored = _run_result("mtp3", [[1, 2, 3], [4, 8, 6]])
    same = _run_result("dspark5", [[1, 2, 3], [4, 5, 6]])
    run_e2e.apply_oracle([plain, noise, wrong, unscored, same])
    assert run_e2e.tolerance(plain) == 0.5
    assert noise.cases[0].status == "noise"
    assert wrong.cases[0].status == "wrong" and "request 1 token 1, 2.5 below" in wrong.cases[0].detail
    assert unscored.cases[0].status == "differ"
    assert same.cases[0].status == "pass"
    # a noisier plain engine widens the tolerance: 2 x 1.5 = 3.0 > 2.5
    plain.scores["plain"] = {"short_b5": [[1.5, 0]]}
    wrong.cases[0].status = "finished"
    run_e2e.apply_oracle([plain, wrong])
    assert wrong.cases[0].status == "noise"
    notes = run_e2e.controls([plain, wrong])
    assert any("tolerance for speculative runs 3.000" in n for n in notes)


def test_schedule_plain_first_and_pairs_variants() -> None:
    plain, spec = run_e2e.schedule(["stock", "patched"], ["plain", "mtp1", "dspark5"])
    assert plain == [("stock", "plain"), ("patched", "plain")]
    assert spec == [("stock", "mtp1"), ("patched", "mtp1"), ("stock", "dspark5"), ("patched", "dspark5")]
    assert run_e2e.schedule(["stock"], ["mtp1"]) == ([], [("stock", "mtp1")])


def test_run_child_collects_scores(tmp_path: Path) -> None:
    res = _run(tmp_path, "score", method="plain")
    assert res.outcome == "done"
    assert res.scores == {"mtp1": {"short_b5": [[0.25, 1], [0.0, -1]]}}


ARGV_CHILD = textwrap.dedent(
    """
    import argparse, json, os, time
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true"); ap.add_argument("--method")
    ap.add_argument("--progress"); ap.add_argument("--score-from", action="append", default=[])
    ap.add_argument("--score-wait", default="")
    a, _ = ap.parse_known_args()
    f = open(a.progress, "a", buffering=1)
    def emit(**kw):
        kw["t"] = time.time(); f.write(json.dumps(kw) + "\\n")
    emit(event="fingerprint", data={"method": a.method})
    time.sleep(0.5 if a.method == "plain" else 0.0)  # an engine start the others must wait for
    emit(event="engine_ready")
    for case in ("short_b5", "short_b24", "long_b3", "short_b1", "long_b1"):
        emit(event="case_start", case=case)
        emit(event="case_done", case=case, tokens=[[1, 2, 3]], gaps=[[0.5, 0.5, 0.5]], seconds=0.01)
    if a.score_wait:  # the real plain child waits for the parent's go file
        emit(event="waiting")
        while not os.path.exists(a.score_wait):
            time.sleep(0.05)
        a.score_from += json.load(open(a.score_wait))
    for path in a.score_from:  # what the real plain child scores
        src = path.rsplit("/", 1)[-1][:-len(".jsonl")].split("-", 1)[1]
        emit(event="score_done", source=src, case="short_b5", worst=[[0.0, -1]])
    emit(event="child_done")
    """
)


def test_parent_warms_up_then_plain_scores_the_speculative_runs(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(ARGV_CHILD)
    site = tmp_path / "site"
    site.mkdir()
    out, work = tmp_path / "out", tmp_path / "work"
    rc = run_e2e.main(["--out", str(out), "--work", str(work), "--child-script", str(child),
                       "--site", f"stock={site}", "--site", f"patched={site}", "--methods", "plain,mtp1,dspark5",
                       "--parallel", "2", "--budget", "120", "--min-start", "1", "--score-reserve", "30"])
    assert rc == 0
    data = json.loads((out / "e2e_results.json").read_text())
    runs = {(r["variant"], r["method"]): r for r in data["runs"]}
    assert set(runs) == {(v, m) for v in ("stock", "patched") for m in ("plain", "mtp1", "dspark5")}
    for v in ("stock", "patched"):
        # each plain engine scored exactly its own variant's speculative runs
        assert sorted(runs[(v, "plain")]["scores"]) == ["dspark5", "mtp1"]
        assert json.loads((work / f"{v}-plain.go").read_text()) == [
            str(work / f"{v}-mtp1.jsonl"), str(work / f"{v}-dspark5.jsonl")]
        assert runs[(v, "mtp1")]["cases"][0]["status"] == "pass"
    assert [(r["variant"], r["method"]) for r in data["runs"]][-2:] == [("stock", "plain"), ("patched", "plain")]

    def first_t(tag: str) -> float:
        return json.loads((work / f"{tag}.jsonl").read_text().splitlines()[0])["t"]

    ready = next(json.loads(ln)["t"] for ln in (work / "stock-plain.jsonl").read_text().splitlines()
                 if json.loads(ln)["event"] == "engine_ready")
    # warm-up: no other engine started before the first one was ready
    for tag in ("patched-plain", "stock-mtp1", "patched-mtp1", "stock-dspark5", "patched-dspark5"):
        assert first_t(tag) >= ready, tag


def test_parent_without_warm_up_starts_engines_together(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(ARGV_CHILD)
    site = tmp_path / "site"
    site.mkdir()
    work = tmp_path / "work"
    rc = run_e2e.main(["--out", str(tmp_path / "out"), "--work", str(work), "--child-script", str(child),
                       "--site", f"stock={site}", "--methods", "plain,mtp1", "--variants", "stock",
                       "--no-warm-first", "--budget", "60", "--min-start", "1", "--score-reserve", "10"])
    assert rc == 0
    starts = {tag: json.loads((work / f"{tag}.jsonl").read_text().splitlines()[0])["t"]
              for tag in ("stock-plain", "stock-mtp1")}
    ready = next(json.loads(ln)["t"] for ln in (work / "stock-plain.jsonl").read_text().splitlines()
                 if json.loads(ln)["event"] == "engine_ready")
    assert starts["stock-mtp1"] < ready


def test_method_suffixes_and_case_selection() -> None:
    assert run_e2e.split_method("mtp3-v2-fd") == ("mtp3", {"v2", "fd"})
    assert run_e2e.split_method("plain") == ("plain", set())
    for bad in ("mtp4", "mtp3-v3", "dspark5-"):
        with pytest.raises(SystemExit):
            run_e2e.split_method(bad)
    cases = run_e2e.build_cases()
    assert [c.name for c in run_e2e.select_cases(cases, "short_b24,short_b5")] == ["short_b24", "short_b5"]
    assert run_e2e.select_cases(cases, "") == cases
    with pytest.raises(SystemExit):
        run_e2e.select_cases(cases, "short_b99")


def test_parent_passes_case_selection_to_children(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(ARGV_CHILD.replace('ap.add_argument("--score-wait", default="")',
                                        'ap.add_argument("--score-wait", default=""); ap.add_argument("--cases")')
                     .replace('for case in ("short_b5", "short_b24", "long_b3", "short_b1", "long_b1"):',
                              'for case in a.cases.split(","):'))
    site = tmp_path / "site"
    site.mkdir()
    out = tmp_path / "out"
    rc = run_e2e.main(["--out", str(out), "--work", str(tmp_path / "work"), "--child-script", str(child),
                       "--site", f"stock={site}", "--variants", "stock", "--methods", "mtp3-v2-fd",
                       "--cases", "short_b24,short_b1", "--budget", "60", "--min-start", "1"])
    assert rc == 0
    data = json.loads((out / "e2e_results.json").read_text())
    (run,) = data["runs"]
    assert run["method"] == "mtp3-v2-fd" and run["outcome"] == "done"
    assert [c["case"] for c in run["cases"]] == ["short_b24", "short_b1"]
    assert all(c["status"] == "finished" for c in run["cases"])  # no plain run: no verdict


def test_forced_deficits() -> None:
    inf = float("inf")
    lps = [{5: -0.1}, {6: -0.2, 9: -1.7}, {7: -0.5, 8: -0.4}, None]
    # token 0 is plain's own choice, token 1 is 1.5 below, token 2 just below a near tie
    assert run_e2e.forced_deficits([5, 9, 7], [5, 9, 7], lps) == [0.0, 1.5, pytest.approx(0.1)]
    # forcing did not hold at step 1 (another token came out), a missing entry, a short output
    assert run_e2e.forced_deficits([5, 9, 7, 3], [5, 6, 7], lps) == [0.0, inf, pytest.approx(0.1), inf]


class _Params:
    def __init__(self, forced: list[int] | None) -> None:
        self.extra_args = {run_e2e.FORCE_KEY: forced} if forced is not None else None


class _Dir:
    def __init__(self, name: str) -> None:
        self.name = name


def test_force_state_follows_batch_updates() -> None:
    st = run_e2e.ForceState()
    out_a: list[int] = []
    out_b: list[int] = [11]
    out_c: list[int] = []
    st.update([(0, _Params([1, 2, 3]), [9], out_a), (1, _Params([4, 5]), [9], out_b), (2, _Params(None), [9], out_c)],
              [], [])
    # the live output list's length is the index of the token sampled next
    assert sorted(st.targets()) == [(0, 1), (1, 5)]
    out_a.append(1)
    out_b.append(5)
    assert sorted(st.targets()) == [(0, 2)]  # row 1 has all its tokens
    st.update([], [], [(0, 2, _Dir("SWAP"))])  # rows 0 and 2 swap
    assert sorted(st.targets()) == [(2, 2)]
    st.update([], [], [(2, 0, _Dir("UNIDIRECTIONAL"))])  # condensed: 2 -> 0
    assert sorted(st.targets()) == [(0, 2)]
    st.update([(0, _Params(None), [9], [])], [], [])  # a new unforced request takes row 0
    assert st.targets() == []
    st.update([(3, _Params([7]), [9], [])], [3], [])
    assert st.targets() == []
    # two forced rows swap: each keeps its own sequence and position
    out_x: list[int] = [8]
    out_y: list[int] = []
    st.update([(0, _Params([8, 9]), [9], out_x), (1, _Params([6, 5]), [9], out_y)], [], [])
    st.update([], [], [(0, 1, _Dir("SWAP"))])
    assert sorted(st.targets()) == [(0, 6), (1, 9)]


def test_report_counts_deficits_beyond_thresholds(tmp_path: Path) -> None:
    plain = _run(tmp_path, "ok", method="plain")
    plain.scores = {"plain": {"short_b5": [[0.0, -1], [0.0, -1]]}, "mtp1": {"short_b5": [[0.7, 1], [0.05, 0]]}}
    plain.score_counts = {"mtp1": {"short_b5": [[2, 1, 1, 0], [2, 0, 0, 0]]}}
    plain.score_mode = "decode"
    runs = [plain, _run(tmp_path, "differ", method="mtp1")]
    run_e2e.apply_oracle(runs)
    c = {x.case: x for x in runs[1].cases}["short_b5"]
    assert c.status == "wrong"  # 0.7 > tolerance max(0.5, 2 x 0.0)
    assert "decode scoring" in c.detail and "tokens beyond 0.1/0.5/1.0: 1/1/0 of 4" in c.detail


def test_noise_table_sets_each_case_beside_plain_decodes_own_tokens(tmp_path: Path) -> None:
    plain = _run(tmp_path, "ok", method="plain")
    plain.scores = {"plain": {"short_b5": [[0.2, 3], [0.0, -1]]}, "mtp1": {"short_b5": [[1.5, 1], [0.05, 0]]}}
    plain.score_counts = {"plain": {"short_b5": [[2, 1, 0, 0], [2, 0, 0, 0]]},
                          "mtp1": {"short_b5": [[2, 2, 1, 1], [2, 1, 0, 0]]}}
    plain.score_mode = "decode"
    spec = _run(tmp_path, "differ", method="mtp1")
    runs = [spec, plain]
    run_e2e.apply_oracle(runs)
    rows = run_e2e.noise_table(runs)
    assert rows[2] == "| - | stock | mtp1 | short_b5 | 4 | 3 (75%)/1 (25%)/1 (25%) | 1 (25%)/0 (0%)/0 (0%) | - / - |"
    # token 0 (the prefill's, same context in both engines): mtp1's request 0 is 1.5 nats off there
    plain.score_first = {"plain": {"short_b5": [[0.0, -1], [0.0, -1]]}, "mtp1": {"short_b5": [[1.5, 0], [0.05, -1]]}}
    assert run_e2e.noise_table(runs)[2].endswith("| 1/2 / 0/2 |")
    md = run_e2e.render_markdown(runs, run_e2e.controls(runs), {})
    assert "## Per-case noise" in md and "own tokens scored by its own engine (forced decode)" in md
    plain.score_counts = {}
    assert run_e2e.noise_table(runs) == []  # nothing scored: no section


def test_merged_report_judges_each_run_by_the_plain_engine_of_its_own_call(tmp_path: Path) -> None:
    # the same method in two calls, each scored by its own call's plain engine
    # (run 5: mtp1-tk120 ran in two calls; the merge used to judge both by the last)
    files = []
    for i, worst in enumerate((0.25, 9.0)):
        (tmp_path / f"c{i}").mkdir()
        plain = _run(tmp_path / f"c{i}", "ok", method="plain")
        plain.scores = {"plain": {"short_b5": [[0.1, 1], [0.0, -1]]}, "mtp1": {"short_b5": [[worst, 1], [0.0, -1]]}}
        plain.score_counts = {"plain": {"short_b5": [[2, 0, 0, 0], [2, 0, 0, 0]]},
                              "mtp1": {"short_b5": [[2, 1, 1, int(worst > 1)], [2, 0, 0, 0]]}}
        plain.score_mode = "decode"
        runs = [_run(tmp_path / f"c{i}", "differ", method="mtp1"), plain]
        run_e2e.write_results(tmp_path / f"c{i}" / "out", runs, argparse.Namespace(
            model="m", weights="scaled", long_len=1, case_deadline=1, start_deadline=1))
        files.append(str(tmp_path / f"c{i}" / "out" / "e2e_results.json"))
    assert run_e2e.main(["--report", str(tmp_path / "merged"), *files]) == 0
    merged = json.loads((tmp_path / "merged" / "e2e_results.json").read_text())
    verdicts = [(r["call"], {c["case"]: c["status"] for c in r["cases"]}["short_b5"])
                for r in merged["runs"] if r["method"] == "mtp1"]
    assert verdicts == [("1:out", "noise"), ("2:out", "wrong")]
    md = (tmp_path / "merged" / "e2e_results.md").read_text()
    assert "| 1:out | stock | mtp1 | short_b5 | 4 |" in md and "| 2:out | stock | mtp1 | short_b5 | 4 |" in md


def test_sm120_topk_route_changes_only_the_family_answer() -> None:
    class Platform:
        device_name = "H200"

        def is_device_capability_family(self, family: int) -> bool:
            return family == 90

        def has_device_capability(self, cap: int) -> bool:
            return cap <= 90

    route = run_e2e.Sm120TopkRoute(Platform())
    assert route.is_device_capability_family(120) is True
    assert route.is_device_capability_family(90) is True and route.is_device_capability_family(100) is False
    assert route.has_device_capability(90) is True and route.device_name == "H200"
    assert run_e2e.split_method("mtp1-tk120") == ("mtp1", {"tk120"})


def test_device_sh_saves_jit_caches_and_a_fresh_machine_restores_them(tmp_path: Path) -> None:
    src = _fake_payload(tmp_path)
    home1, home2 = tmp_path / "home1", tmp_path / "home2"
    (home1 / ".tilelang/cache").mkdir(parents=True)
    (home1 / ".tilelang/cache/kernel.so").write_bytes(os.urandom(2048))
    (home1 / ".cache/vllm/deep_gemm").mkdir(parents=True)
    (home1 / ".cache/vllm/deep_gemm/k.cubin").write_bytes(b"cubin" * 100)
    home2.mkdir()
    # Triton's and Inductor's cache outside $HOME (on the device /tmp/torchinductor_root)
    tmp1, tmp2 = tmp_path / "tmp1/torchinductor_u", tmp_path / "tmp2/torchinductor_u"
    (tmp1 / "triton/0/abc").mkdir(parents=True)
    (tmp1 / "triton/0/abc/fused_moe_kernel.cubin").write_bytes(os.urandom(512))
    base = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHON": sys.executable,
            "E2E_SRC": str(src), "E2E_PREFLIGHT_MODULES": "fakepkg"}
    out1 = tmp_path / "out1"
    env1 = {**base, "HOME": str(home1), "E2E_DIR": str(tmp_path / "e2e1"), "OUT": str(out1), "E2E_SAVE_CACHES": "1",
            "E2E_TMP_CACHE": str(tmp1)}
    first = subprocess.run(["bash", str(E2E / "device.sh"), "--no-run"], capture_output=True, text=True,
                           env=env1, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "jit caches saved: .tilelang .triton .cache" not in first.stdout  # no .triton here
    assert "jit caches saved: .tilelang .cache @torchinductor_u" in first.stdout, first.stdout
    pieces = sorted(p.name for p in out1.glob("jit-cache.*"))
    assert pieces == ["jit-cache.dirs", "jit-cache.sha256", "jit-cache.tar.xz.00"]
    # the next machine: the pieces are carried as .e2e/jit, HOME is bare
    (src / "jit").mkdir()
    for name in pieces:
        (src / "jit" / name).write_bytes((out1 / name).read_bytes())
    env2 = {**base, "HOME": str(home2), "E2E_DIR": str(tmp_path / "e2e2"), "OUT": str(tmp_path / "out2"),
            "E2E_TMP_CACHE": str(tmp2)}
    second = subprocess.run(["bash", str(E2E / "device.sh"), "--no-run"], capture_output=True, text=True,
                            env=env2, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "jit caches restored" in second.stdout
    assert (home2 / ".tilelang/cache/kernel.so").read_bytes() == (home1 / ".tilelang/cache/kernel.so").read_bytes()
    assert (home2 / ".cache/vllm/deep_gemm/k.cubin").is_file()
    # the /tmp cache goes back next to E2E_TMP_CACHE, not into $HOME
    cubin = "triton/0/abc/fused_moe_kernel.cubin"
    assert (tmp2 / cubin).read_bytes() == (tmp1 / cubin).read_bytes()
    assert not (home2 / "torchinductor_u").exists()
    # a damaged piece is refused before anything is staged
    (src / "jit" / "jit-cache.tar.xz.00").write_bytes(b"x")
    third = subprocess.run(["bash", str(E2E / "device.sh"), "--no-run"], capture_output=True, text=True,
                           env={**env2, "E2E_DIR": str(tmp_path / "e2e3")}, timeout=300)
    assert third.returncode == 2 and "sha256 mismatch" in third.stdout


# A stand-in for the parts of vLLM the child touches (no GPU, no torch here): a
# deterministic "model" whose greedy next token depends on the context, so the
# child's decode, forced-decode scoring and prefill scoring run end to end.
FAKE_VLLM = {
    "vllm/__init__.py": """
import types
__version__ = "0.0-fake"

def _greedy(ctx):
    return 2 + (sum(ctx) * 7 + len(ctx)) % 50

def _lps(ctx, tok):
    best = _greedy(ctx)
    d = {best: Logprob(-0.1)}
    if tok != best:
        d[tok] = Logprob(-0.1 - 0.4 * (1 + tok % 3))
    return d

class Logprob:
    def __init__(self, logprob):
        self.logprob = logprob

class SamplingParams:
    def __init__(self, temperature=1.0, max_tokens=16, ignore_eos=False, detokenize=True, logprobs=None,
                 prompt_logprobs=None, extra_args=None):
        self.max_tokens, self.logprobs, self.prompt_logprobs = max_tokens, logprobs, prompt_logprobs
        self.extra_args = extra_args

class LLM:
    def __init__(self, model, **kw):
        self.kw = kw
        import json, os
        if os.environ.get("FAKE_VLLM_KW"):  # what the engine was asked for, for the tests
            keep = {k: v for k, v in kw.items() if isinstance(v, (bool, int, float, str, dict, type(None)))}
            open(os.environ["FAKE_VLLM_KW"], "w").write(json.dumps(keep))
        procs = kw.get("logits_processors") or []
        from vllm.v1.sample.logits_processor import LogitsProcessor
        assert all(issubclass(p, LogitsProcessor) for p in procs)
        self.force = bool(procs)
        from vllm.v1.core.sched.scheduler import Scheduler
        self.sched = Scheduler() if kw.get("speculative_config") else None
        self.next_id = 0

    def get_metrics(self):
        return []

    def reset_prefix_cache(self):
        self.resets = getattr(self, "resets", 0) + 1
        return True

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        # the real one runs METHOD(worker) in each worker (here: one); no torch here to run it
        assert callable(method) and method.__name__ == "zero_kv_caches"
        return [[3, 4096]]

    def generate(self, prompts, params, use_tqdm=True):
        if not isinstance(params, list):
            params = [params] * len(prompts)
        import os
        if os.environ.get("FAKE_VLLM_GEN"):  # each generate's batch: [(prompt length, max_tokens)]
            with open(os.environ["FAKE_VLLM_GEN"], "a") as f:
                f.write(repr([(len(p["prompt_token_ids"]), sp.max_tokens) for p, sp in zip(prompts, params)]) + "\\n")
        outs = []
        for pr, sp in zip(prompts, params):
            ctx = list(pr["prompt_token_ids"])
            forced = (sp.extra_args or {}).get("dsv4e2e_force")
            assert forced is None or self.force, "forced tokens need the logits processor"
            rid, self.next_id = str(self.next_id), self.next_id + 1
            toks, lps = [], []
            for j in range(sp.max_tokens):
                if self.sched is not None and j % 7 == 3:  # a verify that accepts one draft, as vLLM reports it
                    internal = rid + "-abcd1234"
                    self.sched.requests[internal] = types.SimpleNamespace(_output_token_ids=list(toks))
                    self.sched.make_spec_decoding_stats(None, num_draft_tokens=1, num_accepted_tokens=1,
                                                        num_invalid_spec_tokens=None, request_id=internal)
                tok = forced[j] if forced is not None else _greedy(ctx)
                lps.append(_lps(ctx, tok))
                toks.append(tok)
                ctx.append(tok)
            plp = None
            if sp.prompt_logprobs:
                ids = pr["prompt_token_ids"]
                plp = [None] + [_lps(ids[:i], ids[i]) for i in range(1, len(ids))]
            out = types.SimpleNamespace(token_ids=toks, logprobs=lps if sp.logprobs else None)
            outs.append(types.SimpleNamespace(outputs=[out], prompt_logprobs=plp, request_id=rid))
        return outs
""",
    "vllm/inputs.py": "def TokensPrompt(prompt_token_ids):\n    return {'prompt_token_ids': prompt_token_ids}\n",
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/model_loader/__init__.py":
        "def register_model_loader(name):\n    return lambda cls: cls\n",
    "vllm/model_executor/model_loader/dummy_loader.py": "class DummyModelLoader:\n    pass\n",
    "vllm/v1/__init__.py": "",
    "vllm/v1/sample/__init__.py": "",
    "vllm/v1/sample/logits_processor.py": "class LogitsProcessor:\n    pass\n",
    "vllm/v1/core/__init__.py": "",
    "vllm/v1/core/sched/__init__.py": "",
    # vLLM's signature; the real one feeds SpecDecodingStats
    "vllm/v1/core/sched/scheduler.py": """
class Scheduler:
    def __init__(self):
        self.requests = {}

    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                 num_invalid_spec_tokens, request_id):
        return spec_decoding_stats
""",
}


# run_e2e.py's main() in a fresh interpreter (the child side, as the parent starts it)
CHILD_CODE = ("import sys; import importlib.util as u; "
              f"s = u.spec_from_file_location('r', {str(E2E / 'run_e2e.py')!r}); r = u.module_from_spec(s); "
              "sys.modules['r'] = r; s.loader.exec_module(r); sys.exit(r.main(sys.argv[1:]))")


def _stand_in_site(tmp_path: Path) -> Path:
    """A site directory holding the stand-in vLLM (FAKE_VLLM)."""
    site = tmp_path / "site"
    for rel, text in FAKE_VLLM.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text))
    return site


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_child_decodes_and_scores_with_a_stand_in_vllm(tmp_path: Path, mode: str) -> None:
    site = _stand_in_site(tmp_path)
    # a speculative run's tokens: plain's own, except one token replaced in short_b1
    spec = tmp_path / "stock-mtp1.jsonl"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}
    code = ("import sys; sys.argv[0] = 'run_e2e'; import importlib.util as u; "
            f"s = u.spec_from_file_location('r', {str(E2E / 'run_e2e.py')!r}); r = u.module_from_spec(s); "
            "sys.modules['r'] = r; s.loader.exec_module(r); sys.exit(r.main(sys.argv[1:]))")
    base = ["--child", "--model", "m", "--cases", "short_b1,short_b5", "--score-mode", mode]
    first = subprocess.run([sys.executable, "-c", code, *base, "--method", "mtp1", "--progress", str(spec)],
                           env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    events = [json.loads(ln) for ln in spec.read_text().splitlines()]
    done = [e for e in events if e["event"] == "case_done"]
    assert [e["case"] for e in done] == ["short_b1", "short_b5"]
    # make the speculative run wrong at token 5 of short_b1
    lines = spec.read_text().splitlines()
    for i, ln in enumerate(lines):
        e = json.loads(ln)
        if e.get("event") == "case_done" and e["case"] == "short_b1":
            e["tokens"][0][5] = (e["tokens"][0][5] + 1 - 2) % 50 + 2
            lines[i] = json.dumps(e)
    spec.write_text("\n".join(lines) + "\n")
    plain = tmp_path / "stock-plain.jsonl"
    go = tmp_path / "stock-plain.go"
    go.write_text(json.dumps([str(spec)]))
    second = subprocess.run([sys.executable, "-c", code, *base, "--method", "plain", "--progress", str(plain),
                             "--score-wait", str(go)], env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    ev = [json.loads(ln) for ln in plain.read_text().splitlines()]
    assert [e["event"] for e in ev].count("waiting") == 1
    scores = {(e["source"], e["case"]): e for e in ev if e["event"] == "score_done"}
    assert {e.get("mode") for e in ev if e["event"] == "score_start"} == {mode}
    # plain's own tokens are its greedy choices: deficit 0 everywhere
    for case in ("short_b1", "short_b5"):
        assert all(w == [0.0, -1] or w[0] == 0.0 for w in scores[("plain", case)]["worst"]), scores[("plain", case)]
    # every token is judged in the run's own context: from token 5 on the run is
    # off plain's greedy path (the changed token, then tokens chosen after plain's
    # original context); before it, nothing counts
    (w,) = scores[("mtp1", "short_b1")]["worst"]
    assert w[1] >= 5 and w[0] >= 0.4
    assert scores[("mtp1", "short_b5")]["worst"] == scores[("plain", "short_b5")]["worst"]
    (cnt,) = scores[("mtp1", "short_b1")]["counts"]
    assert cnt[0] == 300 and cnt[1] >= 1


def test_diagnostic_suffixes_reach_the_engine(tmp_path: Path) -> None:
    site, code = _stand_in_site(tmp_path), CHILD_CODE
    seen = {}
    for method in ("mtp2", "mtp2-sync-eager-r2"):
        kw = tmp_path / f"{method}.kw.json"
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "FAKE_VLLM_KW": str(kw)}
        res = subprocess.run([sys.executable, "-c", code, "--child", "--model", "m", "--cases", "short_b1",
                              "--method", method, "--progress", str(tmp_path / f"{method}.jsonl")],
                             env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        seen[method] = json.loads(kw.read_text())
    assert seen["mtp2"]["enforce_eager"] is False and "async_scheduling" not in seen["mtp2"]
    assert seen["mtp2-sync-eager-r2"]["enforce_eager"] is True
    assert seen["mtp2-sync-eager-r2"]["async_scheduling"] is False
    assert seen["mtp2"]["speculative_config"] == seen["mtp2-sync-eager-r2"]["speculative_config"]


def test_zero_kv_zeroes_before_every_case_and_every_scoring_pass(tmp_path: Path) -> None:
    site, code = _stand_in_site(tmp_path), CHILD_CODE
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}
    seqs = {}
    for zero in (False, True):
        prog = tmp_path / f"stock-plain-{zero}.jsonl"
        go = tmp_path / f"go-{zero}"
        go.write_text("[]")
        res = subprocess.run([sys.executable, "-c", code, "--child", "--model", "m", "--cases", "short_b1,short_b5",
                              "--method", "plain", "--progress", str(prog), "--score-wait", str(go),
                              *(["--zero-kv"] if zero else [])], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        seqs[zero] = [json.loads(ln)["event"] for ln in prog.read_text().splitlines()]
    assert "kv_zeroed" not in seqs[False]
    # each generate() (two cases, then plain's own tokens scored per case) follows a zeroing
    z = seqs[True]
    starts = [i for i, e in enumerate(z) if e in ("case_start", "score_start")]
    assert len(starts) == 4 and all(z[i - 1] == "kv_zeroed" for i in starts), z
    assert z.count("kv_zeroed") == 4
    assert [e for e in z if e != "kv_zeroed"] == seqs[False]


def test_parent_passes_zero_kv_and_trace_split_to_every_child(tmp_path: Path) -> None:
    script = tmp_path / "fake_child.py"
    script.write_text(textwrap.dedent('''
        import json, sys, time
        a = sys.argv
        prog = a[a.index("--progress") + 1]
        def emit(**kw):
            kw["t"] = time.time()
            open(prog, "a").write(json.dumps(kw) + "\\n")
        emit(event="fingerprint", data={"argv": a[1:], "zero": "--zero-kv" in a})
        emit(event="engine_ready", attention_break="wrapped")
        if "--score-wait" in a:
            import pathlib
            w = pathlib.Path(a[a.index("--score-wait") + 1])
            while not w.exists():
                time.sleep(0.1)
        emit(event="child_done")
    '''))
    out = tmp_path / "out"
    rc = run_e2e.main(["--out", str(out), "--site", f"stock={tmp_path}", "--variants", "stock",
                       "--methods", "plain,mtp2", "--cases", "short_b1", "--budget", "60", "--score-reserve", "0", "--zero-kv", "--trace-split", "7",
                       "--work", str(tmp_path / "work"), "--child-script", str(script), "--min-start", "0"])
    assert rc == 0
    data = json.loads((out / "e2e_results.json").read_text())
    assert {r["method"]: r["fingerprint"]["zero"] for r in data["runs"]} == {"plain": True, "mtp2": True}
    # what the child found once its engine was ready goes into the run's fingerprint
    assert {r["fingerprint"]["attention_break"] for r in data["runs"]} == {"wrapped"}
    for r in data["runs"]:
        argv = r["fingerprint"]["argv"]
        assert argv[argv.index("--trace-split") + 1] == "7"
    assert data["meta"]["KV caches zeroed before each generate"] is True


def test_first_marks_token_0_and_first_position_beyond_one_nat() -> None:
    assert run_e2e.first_marks([0.0, 0.3, 1.2, 5.0]) == [0.0, 2]
    assert run_e2e.first_marks([2.5, 0.0]) == [2.5, 0]
    assert run_e2e.first_marks([0.2, 0.9]) == [0.2, -1]
    assert run_e2e.first_marks([]) == [0.0, -1]
    assert run_e2e.first_marks([float("inf")]) == [float("inf"), 0]


def test_plain_bm_doubles_each_step_and_keeps_the_real_requests(tmp_path: Path) -> None:
    site, code = _stand_in_site(tmp_path), CHILD_CODE
    out = {}
    for method in ("plain-r2", "plain-bm", "plain-bm3", "plain-cg2", "mtp2-fd-na"):
        kw, gen, prog = (tmp_path / f"{method}.{x}" for x in ("kw", "gen", "jsonl"))
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "FAKE_VLLM_KW": str(kw), "FAKE_VLLM_GEN": str(gen)}
        res = subprocess.run([sys.executable, "-c", code, "--child", "--model", "m", "--cases", "short_b5",
                              "--method", method, "--progress", str(prog)], env=env, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0, res.stderr
        done = [json.loads(ln) for ln in prog.read_text().splitlines() if '"case_done"' in ln]
        out[method] = (json.loads(kw.read_text()), gen.read_text().splitlines(), done[0]["tokens"])
    kw_r2, gen_r2, tok_r2 = out["plain-r2"]
    kw_bm, gen_bm, tok_bm = out["plain-bm"]
    kw_bm3, gen_bm3, tok_bm3 = out["plain-bm3"]
    kw_cg2, gen_cg2, tok_cg2 = out["plain-cg2"]
    # -na: vLLM's synthetic rejection sampling at rate 0 (no draft accepted), on the -fd engine
    assert out["mtp2-fd-na"][0]["speculative_config"] == run_e2e.speculative_config("mtp2", {"na"})
    assert out["mtp2-fd-na"][0]["compilation_config"] == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    case = {c.name: c for c in run_e2e.build_cases()}["short_b5"]
    real = [(len(p), n) for p, n in zip(case.prompts, case.max_tokens, strict=True)]
    # one generate each (only the scorer, method "plain", scores); -bm: each request and its mate
    assert [eval(g) for g in gen_r2] == [real] and [eval(g) for g in gen_bm] == [real + [(2, n) for _, n in real]]
    assert [eval(g) for g in gen_bm3] == [real + [(2, n) for _, n in real] * 3]
    assert kw_r2["max_num_seqs"] == 32 and kw_bm["max_num_seqs"] == 64 and kw_bm3["max_num_seqs"] == 128
    # each pads its steps as the speculative engine of its N does (MTP 1, MTP 3: multiples of 1 + N)
    assert kw_bm["compilation_config"] == {"cudagraph_capture_sizes": [2, 4, 8, 16, 24, 32, 40, 48]}
    assert kw_bm3["compilation_config"] == {"cudagraph_capture_sizes": [4, *range(8, 97, 8)]}
    assert "compilation_config" not in kw_r2
    # -cg2: plain decode with MTP 2's graph sizes (multiples of 3 up to 192), nothing else changed
    assert kw_cg2["compilation_config"] == {"cudagraph_capture_sizes": run_e2e.mtp_capture_sizes(2)}
    assert kw_cg2["max_num_seqs"] == 32 and [eval(g) for g in gen_cg2] == [real] and tok_cg2 == tok_r2
    assert run_e2e.mtp_capture_sizes(2)[-1] == 192 and all(x % 3 == 0 for x in run_e2e.mtp_capture_sizes(2))
    # the stand-in's tokens depend only on each prompt: the real requests' come back, the mates' do not
    assert tok_bm == tok_r2 == tok_bm3 and len(tok_bm) == len(case.prompts)
    bad = subprocess.run([sys.executable, "-c", code, "--child", "--model", "m", "--cases", "short_b1",
                          "--method", "mtp1-bm", "--progress", str(tmp_path / "x.jsonl")],
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode != 0 and "control for plain decode" in bad.stderr
    bad = subprocess.run([sys.executable, "-c", code, "--child", "--model", "m", "--cases", "short_b1",
                          "--method", "mtp2-cg2", "--progress", str(tmp_path / "y.jsonl")],
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode != 0 and "-cg is a control for plain decode" in bad.stderr


def test_mates_match_each_request_and_differ_from_it() -> None:
    case = {c.name: c for c in run_e2e.build_cases()}["mid_b24"]
    n = len(case.prompts)
    for k in (1, 2, 5):
        m = run_e2e.with_mates(case, k)
        assert m.prompts[:n] == case.prompts and m.max_tokens == case.max_tokens * (1 + k)
        assert [len(p) for p in m.prompts[n:]] == [2] * n * k and len({tuple(p) for p in m.prompts[n:]}) == n * k
    assert [run_e2e.mates_of(run_e2e.split_method(m)[1]) for m in ("plain", "plain-bm", "plain-bm3-eager")] == [0, 1, 3]


def test_speculative_runs_are_compared_with_plain_bm(tmp_path: Path) -> None:
    R, C = run_e2e.RunResult, run_e2e.CaseResult
    plain = R("patched", "plain", 1.0, None, "done", "", [C("patched", "plain", "mid_b24", "finished", tokens=[[1, 2, 3], [4, 5, 6]])])
    bm = R("patched", "plain-bm", 1.0, None, "done", "", [C("patched", "plain-bm", "mid_b24", "finished", tokens=[[1, 9, 3], [4, 5, 6]])])
    mtp = R("patched", "mtp1", 1.0, None, "done", "", [C("patched", "mtp1", "mid_b24", "finished", tokens=[[1, 9, 3], [4, 5, 7]])])
    # MTP 2 runs 3 tokens a request: plain-bm (2) is not its comparison, plain-bm2 is
    mtp2 = R("patched", "mtp2", 1.0, None, "done", "", [C("patched", "mtp2", "mid_b24", "finished", tokens=[[1, 9, 3], [4, 5, 6]])])
    bm2 = R("patched", "plain-bm2", 1.0, None, "done", "", [C("patched", "plain-bm2", "mid_b24", "finished", tokens=[[1, 9, 3], [4, 5, 6]])])
    runs = [mtp, mtp2, bm, bm2, plain]
    run_e2e.apply_oracle(runs)
    notes = run_e2e.controls(runs)
    # without the acceptance trace a difference cannot be placed before or after a bonus token
    assert ("patched mtp1 vs plain-bm mid_b24: 1/2 requests equal; 1 differ before any bonus token, at tokens 2-2 "
            "(median 2) (accepted drafts not traced): untraced") in notes
    assert "patched mtp2 vs plain-bm2 mid_b24: 2/2 requests equal: pass" in notes
    assert not any(n.startswith(("patched mtp2 vs plain-bm ", "patched mtp1 vs plain-bm2")) for n in notes)
    # plain-bm itself is judged against plain like a speculative run, and is not compared with itself
    assert bm.cases[0].status == "differ" and not any(n.startswith("patched plain-bm vs") for n in notes)


def test_merged_controls_report_each_calls_plain_engine() -> None:
    R, C = run_e2e.RunResult, run_e2e.CaseResult

    def plain(call: str, worst: float) -> run_e2e.RunResult:
        r = R("patched", "plain", 1.0, None, "done", "", [C("patched", "plain", "short_b1", "finished", tokens=[[1]])],
              call=call)
        r.scores, r.score_mode = {"plain": {"short_b1": [[worst, 0]]}}, "decode"
        return r

    notes = run_e2e.controls([plain("1:a", 0.0), plain("2:b", 1.5)])
    own = [n for n in notes if "own tokens" in n]
    assert len(own) == 2, notes  # one line per call, not only the last call's engine
    assert own[0].startswith("patched (call 1:a) plain decode's own tokens") and "worst token 0.0 " in own[0]
    assert own[1].startswith("patched (call 2:b)") and "worst token 1.5 " in own[1]


def test_same_shape_oracle_allows_differences_only_from_a_bonus_token() -> None:
    R, C = run_e2e.RunResult, run_e2e.CaseResult
    bm = R("stock", "plain-bm", 1.0, None, "done", "",
           [C("stock", "plain-bm", "mid_b24", "finished", tokens=[[1, 2, 3, 4], [5, 6, 7, 8], [1, 1, 1, 1]],
              gaps=[[0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5], [0.5] * 4])])

    def mtp(tokens: list[list[int]], accepts: list[list[list[int]]]) -> run_e2e.RunResult:
        return R("stock", "mtp1", 1.0, None, "done", "", [C("stock", "mtp1", "mid_b24", "finished", tokens=tokens,
                                                              accepts=accepts)])

    # request 1 accepted one draft at position 1 (tokens 1 = the draft, 2 = the bonus): it may leave plain-bm at 2
    ok = mtp([[1, 2, 3, 4], [5, 6, 0, 0], [1, 1, 1, 1]], [[], [[1, 1]], [[0, 1], [2, 1]]])
    (row,) = run_e2e.same_shape_rows([bm, ok])
    assert (row.equal, row.after_accept, row.before, row.verdict) == (2, 1, [], "pass")
    # ... but not at 1 (the draft itself, checked at query row 0), and request 0 accepted nothing
    bad = mtp([[1, 2, 9, 4], [5, 0, 0, 0], [1, 1, 1, 1]], [[], [[1, 1]], []])
    (row,) = run_e2e.same_shape_rows([bm, bad])
    assert (row.equal, row.after_accept, [e[:5] for e in row.before], row.verdict) == \
        (1, 0, [(0, 2, -1, 0.5, None), (1, 1, 2, 0.5, None)], "fail")
    table = "\n".join(run_e2e.same_shape_table([bm, bad]))
    assert "| stock | mtp1 | plain-bm | mid_b24 | 1/3 | 0 | 0 (3) | 0: 2, -, 0.5; 1: 1, 2, 0.5 | fail |" in table
    md = run_e2e.render_markdown([bm, bad], run_e2e.controls([bm, bad]), {})
    assert "## Same step shape" in md and "1 differ before any bonus token" not in md.split("## Controls")[0]


def test_step_of_and_the_step_at_which_the_batches_part() -> None:
    # one draft accepted before position 5: positions 5 and 6 share step 5; two more before 10
    acc = [[5, 1], [10, 2]]
    assert [run_e2e.step_of(acc, p) for p in (0, 4, 5, 6, 7, 10, 11, 12, 13)] == [0, 4, 5, 5, 6, 9, 9, 9, 10]
    # request 1 (6 tokens, 1 accepted) ends at step 4, so from step 5 its copy in plain-bmN runs alone;
    # request 2 (8 tokens, 2 accepted) ends at step 5; a request that accepted nothing changes nothing
    tokens = [[0] * 9, [0] * 6, [0] * 8]
    assert run_e2e.batch_change_step(tokens, [[], [[2, 1]], [[1, 1], [3, 1]]]) == 5
    assert run_e2e.batch_change_step(tokens, [[], [], []]) is None


def test_same_shape_oracle_allows_differences_once_the_batches_part() -> None:
    R, C = run_e2e.RunResult, run_e2e.CaseResult
    ref = [[1] * 8, [2] * 8, [3] * 4]
    bm = R("patched", "plain-bm2-fd", 1.0, None, "done", "",
           [C("patched", "plain-bm2-fd", "short_b24", "finished", tokens=ref, gaps=[[0.5] * 8, [0.5] * 8, [0.5] * 4])])

    def mtp(method: str, tokens: list[list[int]]) -> run_e2e.RunResult:
        # request 2 accepts one draft before position 1: its 4 tokens end at step 2, plain-bm2's copy at step 3
        return R("patched", method, 1.0, None, "done", "", [C("patched", method, "short_b24", "finished",
                                                               tokens=tokens, accepts=[[], [], [[1, 1]]])])

    late = mtp("mtp2-fd", [[1] * 5 + [9] * 3, [2] * 3 + [9] * 5, [3] * 4])  # requests 0, 1 part at steps 5, 3
    (row,) = run_e2e.same_shape_rows([bm, late])
    assert (row.change_step, row.equal, row.after_change, row.before, row.verdict) == (3, 1, 2, [], "pass")
    early = mtp("mtp2-fd", [[1] * 8, [2] * 2 + [9] * 6, [3] * 4])  # request 1 parts at step 2: a failure
    (row,) = run_e2e.same_shape_rows([bm, early])
    assert (row.after_change, [e[:5] for e in row.before], row.verdict) == (0, [(1, 2, -1, 0.5, None)], "fail")
    assert row.before[0].step == 2 and not row.twin
    assert "| patched | mtp2-fd | plain-bm2-fd | short_b24 | 2/3 | 0 | 0 (3) |" in "\n".join(
        run_e2e.same_shape_table([bm, early]))
    # each run is held to the plain-bmN of its own CUDA-graph mode: mtp2 (default graphs) is not compared here
    assert run_e2e.same_shape_rows([bm, mtp("mtp2", [[9] * 8] * 3)]) == []
    assert len(run_e2e.same_shape_rows([bm, mtp("mtp2-fd-tk120", [[9] * 8] * 3)])) == 1


def test_na_rejects_every_draft_through_vllms_synthetic_sampling_and_judges_its_own_method() -> None:
    assert run_e2e.speculative_config("mtp2", {"fd", "na"}) == {
        "method": "mtp", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [0.0, 0.0]}
    assert run_e2e.speculative_config("dspark5", {"fd"}) == {"method": "dspark", "num_speculative_tokens": 5}
    assert run_e2e.speculative_config("plain", set()) is None
    with pytest.raises(SystemExit, match="speculative method only"):
        run_e2e.speculative_config("plain", {"na"})
    R, C = run_e2e.RunResult, run_e2e.CaseResult

    def run(method: str, tokens: list[list[int]], accepts: list[list[list[int]]] | None) -> run_e2e.RunResult:
        return R("patched", method, 1.0, None, "done", "", [C("patched", method, "short_b1", "finished",
                                                               tokens=tokens, accepts=accepts)])

    na = run("dspark5-fd-na", [[1, 2, 3, 4, 5]], [[]])
    ok = run("dspark5-fd", [[1, 2, 3, 9, 9]], [[[2, 1]]])  # leaves the -na tokens at its bonus token (3)
    bad = run("dspark5-fd", [[1, 9, 3, 4, 5]], [[[2, 1]]])  # ... but not before it
    other = run("dspark5", [[9] * 5], [[]])  # another engine (default graphs): not judged by dspark5-fd-na
    rows = run_e2e.same_shape_rows([na, ok, other])
    assert [(x.method, x.reference, x.after_accept, x.verdict) for x in rows] == [("dspark5-fd", "dspark5-fd-na", 1,
                                                                                 "pass")]
    (row,) = run_e2e.same_shape_rows([na, bad])
    # the -na engine records no logprobs: an early difference has no tie to excuse it
    assert ([e[:5] for e in row.before], row.verdict) == ([(0, 1, 3, None, None)], "fail")


def test_mates_step_is_the_step_after_the_first_accepted_draft_of_the_batch() -> None:
    # request 1 accepts at position 4 (step 4), request 2 at position 3 (step 3): batches differ from step 4
    assert run_e2e.mates_step([[], [[4, 1]], [[3, 2]]]) == 4
    # position 3 after one accepted draft at position 1 is made at step 2, but the first acceptance is at step 1
    assert run_e2e.mates_step([[[3, 2]], [[1, 1], [3, 2]]]) == 2
    assert run_e2e.mates_step([[], [[4, 0]]]) is None


def test_a_na_twin_excuses_a_near_tie_only_once_the_batches_differ_or_where_plain_does_not_reproduce() -> None:
    R, C = run_e2e.RunResult, run_e2e.CaseResult

    def judge(gap: float, accepts: list[list[list[int]]], plain_worst: float = 0.0,
              twin_logprobs: bool = True, plain_tokens: list[list[int]] | None = None) -> run_e2e.SameShape:
        twin_tokens = [[1, 2, 3, 4, 5, 6], [7, 7, 7, 7, 7, 7]]
        twin = R("patched", "dspark5-na", 1.0, None, "done", "", [C(
            "patched", "dspark5-na", "short_b24", "finished", tokens=twin_tokens, accepts=[[], []],
            gaps=[[1.0, 1.0, 1.0, 1.0, gap, 1.0], [1.0] * 6] if twin_logprobs else None,
            runner_up=[[0, 0, 0, 0, 9, 0], [0] * 6] if twin_logprobs else None)])
        # request 0 accepts no draft and parts from the twin at position 4 (step 4) with the twin's runner-up
        run = R("patched", "dspark5", 1.0, None, "done", "", [C(
            "patched", "dspark5", "short_b24", "finished", tokens=[[1, 2, 3, 4, 9, 6], [7, 7, 7, 7, 7, 7]],
            accepts=accepts)])
        plain = R("patched", "plain", 1.0, None, "done", "", [C(
            "patched", "plain", "short_b24", "finished", tokens=plain_tokens or twin_tokens,
            gaps=[[1.0, 1.0, 1.0, 1.0, 0.0625, 1.0], [1.0] * 6], runner_up=[[0, 0, 0, 0, 9, 0], [0] * 6])])
        plain.scores = {"plain": {"short_b24": [[plain_worst, 0], [0.0, 0]]}}
        (row,) = run_e2e.same_shape_rows([twin, run, plain])
        assert row.twin and row.reference == "dspark5-na"
        return row

    # request 1 accepted a draft at step 1: the batches differ from step 2, and the flip at step 4 is a tie
    row = judge(0.03125, [[], [[1, 1]]])
    assert (row.mates_step, row.reproducible, row.verdict) == (2, True, "tie")
    assert row.before == [run_e2e.Early(0, 4, -1, 0.03125, True, 4, "", True)]
    # ... a clear choice there is a 'batch' difference, which needs the twin-relative noise (unscored here)
    row = judge(0.5, [[], [[1, 1]]])
    assert (row.kind(row.before[0]), row.noise, row.verdict) == ("batch", None, "fail")
    # the batch-mate accepted only at step 4: until then both engines ran the same inputs, a flip is a failure
    assert judge(0.03125, [[], [[4, 1]]]).verdict == "fail"
    assert judge(0.03125, [[], []]).mates_step is None
    # ... unless plain decode itself does not give its own tokens again on the case (long prompts, run 9)
    row = judge(0.03125, [[], [[4, 1]]], plain_worst=0.375)
    assert (row.reproducible, row.verdict) == (False, "tie")
    notes = run_e2e.same_token_count_notes([])  # no rows, no lines
    assert notes == []
    # a twin without logprobs (runs up to 9): plain decode's gap at the same prefix, marked as plain's
    row = judge(0.03125, [[], [[1, 1]]], twin_logprobs=False)
    assert (row.before[0].gap, row.before[0].gap_from, row.before[0].second, row.verdict) == \
        (0.0625, "plain", True, "tie")
    table = "\n".join(run_e2e.same_shape_table([
        R("patched", "dspark5-na", 1.0, None, "done", "", [C(
            "patched", "dspark5-na", "short_b1", "finished", tokens=[[1, 2]], accepts=[[]])]),
        R("patched", "dspark5", 1.0, None, "done", "", [C(
            "patched", "dspark5", "short_b1", "finished", tokens=[[1, 3]], accepts=[[]])])]))
    assert "| dspark5-na (batches differ from step -) | short_b1 | 0/1 | 0 | 0 (-) | 0: 1, -, - @1 | fail (fail 1) |" in table
    # ... only where plain decode made that very prefix
    row = judge(0.03125, [[], [[1, 1]]], twin_logprobs=False,
                plain_tokens=[[1, 2, 5, 5, 5, 5], [7, 7, 7, 7, 7, 7]])
    assert (row.before[0].gap, row.verdict) == (None, "fail")


def test_ranked_rows_name_every_token_of_a_near_tie() -> None:
    # position 0: a clear best; 1: three tokens within TIE_NATS (long_b3 request 0 position 2 in run 9)
    gaps, second, near = run_e2e.ranked_rows([
        {5: -0.1, 6: -2.0}, {29: -1.5, 563: -1.5, 775: -1.5625, 312: -1.9}])
    assert gaps == [1.9, 0.0] and second == [6, 29]  # equal logprobs: the larger token id first, as before
    assert near == [[1, [563, 29, 775]]]


def test_a_tie_of_more_than_two_tokens_is_judged_by_the_recorded_near_ties() -> None:
    R, C = run_e2e.RunResult, run_e2e.CaseResult
    # run 9's long_b3 request 0: plain took 563 at position 2, its runner-up another 563-level token;
    # the run took 775 and its twin 29, all three within TIE_NATS in plain decode
    twin = R("patched", "mtp1-na", 1.0, None, "done", "", [C(
        "patched", "mtp1-na", "long_b3", "finished", tokens=[[595, 835, 29, 1]], accepts=[[]])])
    run = R("patched", "mtp1", 1.0, None, "done", "", [C(
        "patched", "mtp1", "long_b3", "finished", tokens=[[595, 835, 775, 2]], accepts=[[]])])

    def plain(near: list[list[list[object]]] | None) -> run_e2e.RunResult:
        r = R("patched", "plain", 1.0, None, "done", "", [C(
            "patched", "plain", "long_b3", "finished", tokens=[[595, 835, 563, 3]], gaps=[[0.4, 0.4, 0.0, 0.1]],
            runner_up=[[1, 1, 563, 1]], near=near)])
        r.scores = {"plain": {"long_b3": [[0.375, 149]]}}  # plain does not reproduce its own tokens here
        return r

    # with the runner-up alone (runs up to 9) the three-way tie cannot be told from a wrong token
    (row,) = run_e2e.same_shape_rows([twin, run, plain(None)])
    assert (row.reproducible, row.before[0].gap_from, row.before[0].second, row.verdict) == \
        (False, "plain", False, "fail")
    # with the near ties recorded it can, and a token outside them still fails
    (row,) = run_e2e.same_shape_rows([twin, run, plain([[[2, [563, 29, 775]]]])])
    assert (row.before[0].second, row.verdict) == (True, "tie")
    (row,) = run_e2e.same_shape_rows([twin, run, plain([[[2, [563, 29]]]])])
    assert (row.before[0].second, row.verdict) == (False, "fail")
    # a twin's own near ties judge the run directly (from run 10)
    twin.cases[0].gaps, twin.cases[0].near = [[0.4, 0.4, 0.0, 0.1]], [[[2, [29, 775]]]]
    (row,) = run_e2e.same_shape_rows([twin, run, plain(None)])
    assert (row.before[0].gap_from, row.before[0].second, row.verdict) == ("", True, "tie")


def test_eager_prefill_references_report_exact_agreement_per_case() -> None:
    R, C = run_e2e.RunResult, run_e2e.CaseResult

    def run(method: str, tokens: list[list[int]], variant: str = "stock") -> run_e2e.RunResult:
        return R(variant, method, 1.0, None, "done", "", [C(variant, method, "short_b5", "finished", tokens=tokens)])

    fd = run("plain-fd", [[1, 2, 3], [4, 5, 6]])
    runs = [fd, run("plain", [[9, 2, 3], [4, 5, 6]]), run("mtp2-fd", [[1, 2, 3], [4, 5, 6]]),
            run("plain-bm2-fd", [[7, 7, 7], [7, 7, 7]]), run("mtp2-fd", [[9] * 3] * 2, variant="patched")]
    notes = run_e2e.eager_prefill_notes(runs)
    # plain-bmN (mates) and another variant's runs are not compared; plain itself (default graphs) is, as a subject
    assert notes == ["stock plain vs plain-fd short_b5: 1/2 requests equal, the others part at tokens 0-0",
                     "stock mtp2-fd vs plain-fd short_b5: 2/2 requests equal"], notes
    assert run_e2e.eager_prefill_notes([run("plain-cg2", [[1]]), run("mtp1", [[1]])]) == []


def test_breakable_env_is_set_before_vllm_unless_unsplit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_USE_BREAKABLE_CUDAGRAPH", raising=False)
    run_e2e.breakable_env({"fd"})
    assert os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "1"
    run_e2e.breakable_env({"unsplit"})  # runs 1-8's order: vLLM sets it itself, after the import
    assert "VLLM_USE_BREAKABLE_CUDAGRAPH" not in os.environ
    assert run_e2e.split_method("plain-unsplit") == ("plain", {"unsplit"})
    # the report's view of it: vLLM's decorator wraps with functools.wraps (__wrapped__)
    mod = ModuleType("vllm.models.deepseek_v4.attention")

    def impl() -> None:
        pass

    mod.DeepseekV4Attention = type("DeepseekV4Attention", (), {"attention_impl": impl})
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    assert run_e2e.attention_break() == "not wrapped"
    impl.__wrapped__ = lambda: None
    assert run_e2e.attention_break() == "wrapped"
    monkeypatch.delitem(sys.modules, mod.__name__)
    assert run_e2e.attention_break() == "not loaded"


def test_bm_capture_sizes_pad_as_the_speculative_engine_does() -> None:
    # vLLM 0.26.0 (VllmConfig._set_cudagraph_sizes): max min(32 * (1 + k) * 2, 512); 1, 2, 4, then 8s, 16s from 256
    assert run_e2e.spec_capture_sizes(0) == run_e2e.CAPTURE_SIZES
    assert run_e2e.spec_capture_sizes(5)[-4:] == [336, 352, 368, 384] and 248 in run_e2e.spec_capture_sizes(5)
    # MTP (V1 runner) rounds to multiples of 1 + k; each list stops at the first size >= 24 requests' step
    assert run_e2e.bm_capture_sizes(2) == [3, 6, 9, 18, 24, 33, 42, 48, 57, 66, 72]
    assert all(s % 3 == 0 for s in run_e2e.bm_capture_sizes(2))
    # DSpark (V2 runner) keeps vLLM's list: up to 24 * 6 = 144
    assert run_e2e.bm_capture_sizes(5, v1_runner=False)[-3:] == [128, 136, 144]
    assert run_e2e.DSPARK_KS == {5}


def test_child_reports_accepted_drafts_of_speculative_runs_only(tmp_path: Path) -> None:
    site = _stand_in_site(tmp_path)
    got = {}
    for method in ("mtp1", "plain-r2"):
        prog = tmp_path / f"{method}.jsonl"
        res = subprocess.run([sys.executable, "-c", CHILD_CODE, "--child", "--model", "m", "--cases", "short_b5",
                              "--method", method, "--progress", str(prog)],
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)}, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0, res.stderr
        ev = [json.loads(ln) for ln in prog.read_text().splitlines()]
        fp = next(e for e in ev if e["event"] == "fingerprint")["data"]
        done = next(e for e in ev if e["event"] == "case_done")
        got[method] = (fp.get("accept_trace"), done["accepts"])
        got[method + " runner_up"] = done["runner_up"]
    # the stand-in scheduler accepts one draft at every 7th output position (3, 10, ...) of each request,
    # under its internal id (external id + "-" + 8 characters)
    trace, accepts = got["mtp1"]
    case = {c.name: c for c in run_e2e.build_cases()}["short_b5"]
    assert trace == "traced"
    assert accepts == [[[p, 1] for p in range(3, n, 7)] for n in case.max_tokens]
    assert got["plain-r2"] == (None, None)
    # plain engines record each position's second choice (the stand-in reports only its greedy token: -1)
    assert got["mtp1 runner_up"] is None
    assert got["plain-r2 runner_up"] == [[-1] * n for n in case.max_tokens]



def test_split_trace_counts_only_once_the_gate_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import types

    def split(cam, decode_threshold=1, require_uniform=False, treat_short_extends_as_decodes=True):
        return (1, 1, 3, 5)

    names = ["vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends", "vllm.v1.attention.backends.utils",
             "vllm.v1.attention.backends.mla", "vllm.v1.attention.backends.mla.sparse_swa"]
    for n in names:
        monkeypatch.setitem(sys.modules, n, types.ModuleType(n))
    sys.modules["vllm.v1.attention.backends.utils"].split_decodes_and_prefills = split
    swa = sys.modules["vllm.v1.attention.backends.mla.sparse_swa"]
    swa.split_decodes_and_prefills = split  # imported by name, as vLLM's builders do
    for n in run_e2e.SPLIT_USERS:
        if n not in sys.modules:
            monkeypatch.setitem(sys.modules, n, types.ModuleType(n))  # modules without the name
    events: list[dict] = []
    gate = threading.Event()
    status = run_e2e.install_split_trace(lambda **kw: events.append(kw), 2, gate)
    assert status["vllm.v1.attention.backends.mla.sparse_swa"] == "traced"
    cam = types.SimpleNamespace(num_reqs=2, query_start_loc_cpu=_Lens([0, 3, 8]))
    for _ in range(3):  # warm-up and capture: not counted
        assert swa.split_decodes_and_prefills(cam, 3) == (1, 1, 3, 5)
    assert events == []
    gate.set()
    for _ in range(3):
        swa.split_decodes_and_prefills(cam, decode_threshold=3)
    assert [(e["who"], e["threshold"], e["result"], e["query_lens"]) for e in events] == [("sparse_swa", 3, [1, 1, 3, 5], [3, 5])] * 2


class _Lens(list):
    """query_start_loc_cpu stand-in: slicing and element-wise subtraction as a tensor does."""

    def __getitem__(self, i):  # type: ignore[override]
        out = super().__getitem__(i)
        return _Lens(out) if isinstance(i, slice) else out

    def __sub__(self, other):  # type: ignore[override]
        return _Lens(a - b for a, b in zip(self, other, strict=True))


def test_same_shape_oracle_tells_near_tie_flips_from_other_differences() -> None:
    R, C = run_e2e.RunResult, run_e2e.CaseResult

    def rows(gap: float, runner_up: list[list[int]] | None, took: int) -> run_e2e.SameShape:
        bm = R("patched", "plain-bm2", 1.0, None, "done", "", [C(
            "patched", "plain-bm2", "mid_b24", "finished", tokens=[[1, 2, 3], [4, 5, 6]],
            gaps=[[1.0, gap, 1.0], [1.0] * 3], runner_up=runner_up)])
        mtp = R("patched", "mtp2", 1.0, None, "done", "", [C(
            "patched", "mtp2", "mid_b24", "finished", tokens=[[1, took, 0], [4, 5, 6]], accepts=[[], []])])
        (row,) = run_e2e.same_shape_rows([bm, mtp])
        return row

    # plain-bm2 nearly tied at token 1 and the run took its second choice: a rounding flip
    assert rows(0.03125, [[7, 9, 7], [7, 7, 7]], 9).verdict == "tie"
    assert rows(0.03125, None, 9).verdict == "tie"  # results without runner_up: the gap alone
    # a clear choice left, or a token that was not the second choice: not a tie
    assert rows(0.5, [[7, 9, 7], [7, 7, 7]], 9).verdict == "fail"
    row = rows(0.03125, [[7, 8, 7], [7, 7, 7]], 9)
    assert row.verdict == "fail" and [e[:5] for e in row.before] == [(0, 1, -1, 0.03125, False)]
    assert "(not its 2nd choice)" in "\n".join(run_e2e.same_shape_table([
        R("patched", "plain-bm2", 1.0, None, "done", "", [C("patched", "plain-bm2", "mid_b24", "finished",
                                                               tokens=[[1, 2, 3]], gaps=[[1.0, 0.03, 1.0]],
                                                               runner_up=[[7, 8, 7]])]),
        R("patched", "mtp2", 1.0, None, "done", "", [C("patched", "mtp2", "mid_b24", "finished", tokens=[[1, 9, 0]],
                                                         accepts=[[]])])]))



def test_controls_give_the_gaps_where_plain_and_plain_bm_part() -> None:
    R, C = run_e2e.RunResult, run_e2e.CaseResult
    plain = R("patched", "plain", 1.0, None, "done", "", [C("patched", "plain", "mid_b24", "finished",
                                                          tokens=[[1, 2, 3], [4, 5, 6], [7, 8, 9]],
                                                          gaps=[[0.5, 0.25, 1.0], [0.0625, 1.0, 1.0], [1.0] * 3])])
    bm = R("patched", "plain-bm5", 1.0, None, "done", "", [C("patched", "plain-bm5", "mid_b24", "finished",
                                                            tokens=[[1, 0, 3], [0, 5, 6], [7, 8, 9]])])
    other_call = R("patched", "plain-bm2", 1.0, None, "done", "", [C("patched", "plain-bm2", "mid_b24", "finished",
                                                                     tokens=[[0, 0, 0]] * 3)], call="2:x")
    notes = run_e2e.controls([plain, bm, other_call])
    assert "patched plain vs plain-bm5 mid_b24: 2/3 requests part, at plain's top-2 gaps 0.0625-0.25 (median 0.25)" \
        in notes
    assert not any("plain-bm2" in n and "part" in n for n in notes)  # no plain engine in its call


def _twin_case(method: str, tokens: list[list[int]], accepts: list[list[list[int]]], **kw: object) -> object:
    R, C = run_e2e.RunResult, run_e2e.CaseResult
    return R("patched", method, 1.0, None, "done", "", [C(
        "patched", method, "short_b24", "finished", tokens=tokens, accepts=accepts, **kw)])


def test_twin_noise_passes_a_run_no_further_off_than_its_twin_and_fails_a_worse_one() -> None:
    ok = run_e2e.TwinNoise([4440, 869, 315, 88], [4440, 891, 303, 84], 2.65, 3.63)
    assert ok.ok and all(z < 1 for z in ok.z)
    # a run with twice the twin's tokens more than 1 nat off: what accepted wrong drafts look like
    bad = run_e2e.TwinNoise([4440, 869, 315, 176], [4440, 891, 303, 84], 2.65, 3.63)
    assert not bad.ok and bad.z[2] > run_e2e.TWIN_Z_MAX
    # a few more tokens off at one threshold is within the noise; many more is not
    assert run_e2e.TwinNoise([4440, 869, 330, 88], [4440, 891, 303, 84], 2.65, 3.63).ok
    assert not run_e2e.TwinNoise([4440, 869, 390, 88], [4440, 891, 303, 84], 2.65, 3.63).ok
    # different token counts (one case cut short): not comparable
    assert not run_e2e.TwinNoise([4000, 800, 300, 80], [4440, 891, 303, 84], 2.0, 3.63).ok
    assert "z" in ok.describe() and "869/315/88 vs the twin's 891/303/84 of 4440" in ok.describe()


def test_a_twin_leaves_batch_and_nondeterministic_differences_to_the_noise_comparison() -> None:
    twin_tokens = [[1, 2, 3, 4, 5, 6], [7, 7, 7, 7, 7, 7]]
    twin = _twin_case("dspark5-na", twin_tokens, [[], []], gaps=[[1.0] * 6, [1.0] * 6],
                      runner_up=[[0] * 6, [0] * 6])

    def judge(run_tokens: list[list[int]], accepts: list[list[list[int]]], plain_rows: list[list[float]],
              counts: list[list[int]] | None) -> run_e2e.SameShape:
        run = _twin_case("dspark5", run_tokens, accepts)
        plain = _twin_case("plain", twin_tokens, [[], []])
        plain.scores = {"plain": {"short_b24": plain_rows},
                        "dspark5": {"short_b24": [[0.5, 1], [0.5, 1]]},
                        "dspark5-na": {"short_b24": [[0.5, 1], [0.5, 1]]}}
        if counts is not None:
            plain.score_counts = {"dspark5": {"short_b24": [counts[0], [300, 10, 2, 0]]},
                                  "dspark5-na": {"short_b24": [counts[1], [300, 10, 2, 0]]}}
        (row,) = run_e2e.same_shape_rows([twin, run, plain])
        table = "\n".join(run_e2e.same_shape_table([twin, run, plain]))
        assert f"| {row.verdict}" in table
        if row.verdict == "noise":
            assert f"| noise ({row.kinds_text()}; z {'/'.join(map(str, row.noise.z))}) |" in table
        return row

    same = [[300, 60, 20, 6], [300, 58, 21, 5]]
    # request 1 accepted a draft at step 1; request 0 parts at step 4 with a clear choice (gap 1.0)
    row = judge([[1, 2, 3, 4, 9, 6], twin_tokens[1]], [[], [[1, 1]]], [[0.0, 0], [0.0, 0]], same)
    assert (row.kind(row.before[0]), row.verdict) == ("batch", "noise")
    # ... and fails when the run is further off than its twin
    row = judge([[1, 2, 3, 4, 9, 6], twin_tokens[1]], [[], [[1, 1]]], [[0.0, 0], [0.0, 0]],
                [[300, 90, 45, 20], [300, 58, 21, 5]])
    assert (row.kind(row.before[0]), row.verdict) == ("batch", "fail")
    # ... or without a score to compare
    row = judge([[1, 2, 3, 4, 9, 6], twin_tokens[1]], [[], [[1, 1]]], [[0.0, 0], [0.0, 0]], None)
    assert (row.noise, row.verdict) == (None, "fail")
    # before the batches differ (no draft accepted) a clear difference on a request plain decode
    # reproduces is a failure, whatever the noise says
    row = judge([[1, 2, 3, 4, 9, 6], twin_tokens[1]], [[], []], [[0.0, 0], [0.0, 0]], same)
    assert (row.mates_step, row.kind(row.before[0]), row.verdict) == (None, "fail", "fail")
    # on a request plain decode does not reproduce (request 0 here), the noise comparison decides ...
    row = judge([[1, 2, 3, 4, 9, 6], twin_tokens[1]], [[], []], [[0.4, 3], [0.0, 0]], same)
    assert (row.before[0].reproducible, row.kind(row.before[0]), row.verdict) == (False, "nondet", "noise")
    # ... but not for another request of the case that plain decode does reproduce
    row = judge([twin_tokens[0], [7, 7, 9, 7, 7, 7]], [[], []], [[0.4, 3], [0.0, 0]], same)
    assert (row.reproducible, row.before[0].reproducible, row.verdict) == (False, True, "fail")


def test_plain_reproducible_per_request_and_repeat_notes_across_calls() -> None:
    plain = _twin_case("plain", [[1, 2], [3, 4]], [[], []])
    plain.scores = {"plain": {"short_b24": [[0.375, 1], [0.0, 0]]}}
    assert run_e2e.plain_reproducible(plain, "short_b24") is False
    assert [run_e2e.plain_reproducible(plain, "short_b24", i) for i in (0, 1, 2)] == [False, True, None]
    assert run_e2e.plain_reproducible(plain, "long_b3") is None
    # the same plain engine in three calls: request 0 changes from token 1 in one of them
    runs = []
    for call, first in (("1:a", [1, 2, 3]), ("2:b", [1, 5, 3]), ("3:c", [1, 2, 3])):
        r = _twin_case("plain", [first, [4, 4, 4]], [[], []])
        r.call = call
        runs.append(r)
    assert run_e2e.repeat_notes(runs) == [
        "patched plain short_b24 in calls 1:a, 2:b, 3:c: request 0 differs (from token 1); the other 1 equal"]
    runs[1].cases[0].tokens = [[1, 2, 3], [4, 4, 4]]
    assert run_e2e.repeat_notes(runs) == ["patched plain short_b24 in calls 1:a, 2:b, 3:c: all 2 requests equal "
                                          "in every call"]
    assert run_e2e.repeat_notes(runs[:1]) == []


def test_verdict_table_takes_the_twin_verdict_or_how_the_case_ended() -> None:
    R, C = run_e2e.RunResult, run_e2e.CaseResult
    twin = _twin_case("mtp1-na", [[1, 2, 3]], [[]])
    run = R("patched", "mtp1", 1.0, None, "done", "", [
        C("patched", "mtp1", "short_b24", "noise", tokens=[[1, 2, 3]], accepts=[[]]),
        C("patched", "mtp1", "long_b3", "hang")])
    stock = R("stock", "mtp1", 1.0, None, "done", "", [C("stock", "mtp1", "short_b24", "wrong", tokens=[[1, 9, 9]])])
    rows = run_e2e.verdict_table([twin, run, stock])
    # the twin's exact verdict (pass) replaces the plain-decode one (noise); a hang stays a hang;
    # without a twin in the call the plain-decode verdict counts
    assert rows[2:] == ["| - | patched | mtp1 | short_b24: pass; long_b3: hang | mtp1-na |",
                        "| - | stock | mtp1 | short_b24: wrong | plain |"]
    assert run_e2e.verdict_table([twin]) == []
