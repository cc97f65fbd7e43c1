"""dsv4patch.delivery.installed_state: the records of ``status --installed`` and what they write.

The JSON of ``status --installed --format json`` and of the self-test's ``installed``
report is a schema operators parse: each record's keys (and their order) are pinned
here, in every form the record takes.  The probe's answer comes from the interpreter
under test: each wrong shape is refused on read, naming what is wrong.
"""

from __future__ import annotations

import json

import pytest

from dsv4patch.delivery.installed import InstalledReport
from dsv4patch.delivery.installed_state import (
    KERNEL_LIBRARY,
    ActiveCheck,
    FileState,
    InstalledPackage,
    KernelCheck,
    KernelUnit,
    PatchState,
    Probe,
    ProbedKernels,
    ProbedVllm,
    SbomCheck,
    TorchFit,
    WheelProvenance,
)
from dsv4patch.errors import ParameterError

GOOD = {"python": "/usr/bin/python3",
        "vllm": {"package": "/site/vllm", "root": "/site", "version": "0.27.1+dsv4.abc", "provenance": "{}",
                 "sboms": ["/site/vllm-0.27.1.dist-info/sboms/dsv4patch.cdx.json"]},
        "torch": "2.9.0", "kernels": {"dir": "/site/k", "build_info": {"tree_id": "t"}, "entry_points": ["k:reg"]}}


def test_the_probes_answer_is_read_into_its_record():
    p = Probe.from_json(GOOD, label="--python py")
    assert p == Probe("/usr/bin/python3",
                      ProbedVllm("/site/vllm", "/site", "0.27.1+dsv4.abc", "{}",
                                 ("/site/vllm-0.27.1.dist-info/sboms/dsv4patch.cdx.json",)),
                      "2.9.0", ProbedKernels("/site/k", {"tree_id": "t"}, ("k:reg",)))
    bare = Probe.from_json({"python": "p", "vllm": None, "torch": None, "kernels": None}, label="x")
    assert bare == Probe("p", None, None, None)
    failed = Probe.from_json({"python": "p", "vllm": {"package": "a", "root": "b", "version": None,
                                                      "error": "OSError()"}}, label="x")
    assert failed.vllm == ProbedVllm("a", "b", None, None, (), "OSError()")


@pytest.mark.parametrize(("answer", "why"), [
    (None, 'not an object with a "python" string'),
    ([], 'not an object with a "python" string'),
    ({"python": 3}, 'not an object with a "python" string'),
    ({"python": "p", "vllm": "x"}, '"vllm" has no string "package" and "root"'),
    ({"python": "p", "vllm": {"package": "a"}}, '"vllm" has no string "package" and "root"'),
    ({"python": "p", "vllm": {"package": "a", "root": "b", "version": 1}}, "version or provenance that is not a"),
    ({"python": "p", "vllm": {"package": "a", "root": "b", "provenance": {}}}, "version or provenance that is not"),
    ({"python": "p", "vllm": {"package": "a", "root": "b", "sboms": None}}, '"vllm".sboms is not a list of strings'),
    ({"python": "p", "vllm": {"package": "a", "root": "b", "sboms": [1]}}, '"vllm".sboms is not a list of strings'),
    ({"python": "p", "torch": 2}, '"torch" is not a version string'),
    ({"python": "p", "kernels": []}, '"kernels" has no string "dir"'),
    ({"python": "p", "kernels": {"dir": 1}}, '"kernels" has no string "dir"'),
    ({"python": "p", "kernels": {"dir": "d", "entry_points": "k:reg"}}, '"kernels".entry_points is not a list'),
])
def test_a_probe_answer_of_the_wrong_shape_is_refused_on_read(answer, why):
    with pytest.raises(ParameterError) as exc:
        Probe.from_json(answer, label="--python /bin/py")
    assert str(exc.value).startswith("--python /bin/py: the probe's answer is not what it prints (")
    assert why in str(exc.value) and str(exc.value).endswith("is this a Python interpreter?")


def test_the_file_and_patch_states_write_their_keys():
    assert FileState("present").to_json() == {"state": "present"}
    assert list(FileState("other", problem="a link").to_json()) == ["state", "problem"]
    assert list(FileState("other", sha256="s", diff="+1 -1").to_json()) == ["state", "sha256", "diff"]
    p = PatchState("other", {"vllm/a.py": FileState("other", sha256="s", diff="d"), "vllm/b.py": FileState("present")})
    assert p.to_json() == {"state": "other", "files": {"vllm/a.py": {"state": "other", "sha256": "s", "diff": "d"},
                                                       "vllm/b.py": {"state": "present"}}}
    assert list(p.not_present()) == ["vllm/a.py"]
    assert PatchState("upstream").to_json() == {"state": "upstream", "files": {}}
    peeled = PatchState("other", {"vllm/a.py": FileState("other")}, problem="error: patch failed")
    assert list(peeled.to_json()) == ["state", "files", "problem"]
    assert PatchState("missing", {KERNEL_LIBRARY: FileState("missing")}).to_json()["files"] == {
        "<kernel library>": {"state": "missing"}}


def test_the_kernel_check_writes_its_keys_in_each_form():
    absent = KernelCheck("dsv4patch_kernels_0_27_1", installed=False, ok=False, note="not installed")
    assert absent.to_json() == {"package": "dsv4patch_kernels_0_27_1", "installed": False, "ok": False,
                                "note": "not installed"}
    k = KernelCheck("k", installed=True, ok=True, dir="/site/k", tree_id="t", library="/site/k/lib.so",
                    library_present=True, units=(KernelUnit("csrc/a.cu", ["sm_90a"], []),), hooked=True,
                    torch=TorchFit("2.9.0+cu128", "2.9.0", "2.9.0"))
    assert list(k.to_json()) == ["package", "installed", "dir", "tree_id", "library", "library_present", "units",
                                 "routes", "torch", "ok"]
    assert k.to_json()["units"] == [{"unit": "csrc/a.cu", "sass": ["sm_90a"], "ptx": []}]
    assert k.to_json()["routes"] == {"vllm-hook": True, "entry-point": False}
    assert k.to_json()["torch"] == {"built": "2.9.0+cu128", "required": "2.9.0", "installed": "2.9.0"}
    noted = KernelCheck("k", installed=True, ok=False, note="built from tree x",
                        active=ActiveCheck(checked=False, active=None, reason="no GPU on this machine"))
    assert list(noted.to_json())[-3:] == ["ok", "note", "active"]
    assert noted.to_json()["active"] == {"checked": False, "active": None, "reason": "no GPU on this machine"}
    ran = ActiveCheck(checked=True, active=False, exit_code=1, report={"output": "x"})
    assert ran.to_json() == {"checked": True, "exit_code": 1, "report": {"output": "x"}, "active": False}


def test_the_sbom_check_and_the_package_write_their_keys():
    assert list(SbomCheck("absent", None, ("no sbom",), others=()).to_json()) == ["state", "path", "others",
                                                                                   "problems"]
    assert SbomCheck("unreadable", "/s.json", ("/s.json: a link",)).to_json() == {
        "state": "unreadable", "path": "/s.json", "problems": ["/s.json: a link"]}
    assert InstalledPackage("/site/vllm", None).to_json() == {"package": "/site/vllm", "version": None}
    text = json.dumps({"patched_tree": "b", "pin": "0.27.1", "extra": 1, "version": "v"})
    wheel = WheelProvenance.from_text(text)
    assert isinstance(wheel, WheelProvenance)
    assert InstalledPackage("/site/vllm", "v", wheel).to_json()["provenance"] == {
        "pin": "0.27.1", "version": "v", "patch_set_sha256": None, "patched_tree": "b"}
    assert list(wheel.to_json()) == ["pin", "version", "patch_set_sha256", "patched_tree"]
    for bad in ("[]", "not json", '"a string"'):
        assert WheelProvenance.from_text(bad) == "unreadable"
        assert InstalledPackage("p", "v", "unreadable").to_json()["provenance"] == "unreadable"


def _report(**kw: object) -> InstalledReport:
    base: dict = {"python": "py", "pin": "0.27.1", "vllm_version": "0.27.1",
                  "installed": InstalledPackage("/site/vllm", "0.27.1"),
                  "patches": {"0001-a.patch": PatchState("present", {"vllm/a.py": FileState("present")})},
                  "kernels": KernelCheck("k", installed=False, ok=False, note="not installed"), "ok": False,
                  "notes": ["n"], "patch_set_sha256": "s", "patched_tree": "t",
                  "sbom": SbomCheck("absent", None, ("none",), others=()), "sbom_document": None}
    base.update(kw)
    return InstalledReport(**base)


def test_the_reports_json_keeps_its_keys_and_order():
    assert list(_report().to_json()) == ["python", "pin", "vllm_version", "installed", "patches", "kernels", "ok",
                                         "notes", "patch_set_sha256", "patched_tree", "sbom"]
    bare = InstalledReport("py", "0.27.1", "0.27.1", None, {}, None, False, ["vLLM is not installed in py"])
    assert bare.to_json() == {"python": "py", "pin": "0.27.1", "vllm_version": "0.27.1", "installed": None,
                              "patches": {}, "kernels": None, "ok": False, "notes": ["vLLM is not installed in py"]}
    rep = _report().to_json()
    assert rep["patches"] == {"0001-a.patch": {"state": "present", "files": {"vllm/a.py": {"state": "present"}}}}
    assert rep["sbom"] == {"state": "absent", "path": None, "others": [], "problems": ["none"]}
    json.dumps(rep)  # plain JSON all the way down


def test_the_selftests_installed_report_is_the_status_json_and_the_sbom_text(monkeypatch):
    from dsv4patch import delivery
    from dsv4patch.proofs.selftest import runner

    kernel = KernelCheck("k", installed=True, ok=True, dir="/k", tree_id="t", library="/k/lib.so",
                         library_present=True, hooked=True, torch=TorchFit("2.9.0", "2.9.0", "2.9.0"))
    monkeypatch.setattr(delivery, "inspect_installed",
                        lambda pin, python, *, ctx: _report(kernels=kernel, ok=True, sbom_document="{}"),
                        raising=False)
    monkeypatch.setattr(delivery, "check_kernels_active",
                        lambda python, kdist: ActiveCheck(checked=True, active=False, exit_code=1, report={}),
                        raising=False)
    res = runner.check_installed(None, "py", ctx=None, on_gpu=True)  # type: ignore[arg-type]
    out = res.to_json()["report"]
    assert list(out) == ["python", "pin", "vllm_version", "installed", "patches", "kernels", "ok", "notes",
                         "patch_set_sha256", "patched_tree", "sbom", "sbom_document"]
    assert out["sbom_document"] == "{}" and out["ok"] is False and res.ok is False  # the GPU check failed
    assert list(out["kernels"])[-2:] == ["ok", "active"] and out["kernels"]["active"]["exit_code"] == 1
    res = runner.check_installed(None, "py", ctx=None, on_gpu=False)  # type: ignore[arg-type]
    assert res.ok is True and "active" not in res.to_json()["report"]["kernels"]
