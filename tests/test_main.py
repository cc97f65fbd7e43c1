"""main.py's start-up: each run imports only what its command runs.

``--version`` imports no command; ``--help`` and ``<command> --help`` import the
command modules they print but not the core those run; ``check`` (cold and warm) imports neither the
kernel build, its toolchain, the wheel and delivery machinery nor selftest,
although ``commands/_common.py`` (which every command imports) offers the
kernel rebuild that ``apply`` runs.  Read from a real run of the
CLI in a fresh interpreter (``sys.modules`` when it exits), on a real git pin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MINI_FILES, ROOT, git_pin, write_lock
from dsv4patch import __version__

# What check and --version never run: the kernel build and its toolchain, apply's
# transaction and conflict machinery, the wheel, image and SBOM delivery, the test
# environments and selftest, porting and the index client.
HEAVY = ("dsv4patch.kernels.building", "dsv4patch.kernels.toolchain", "dsv4patch.kernels.build",
         "dsv4patch.kernels.sources", "dsv4patch.kernels.fatbin", "dsv4patch.kernels.stock",
         "dsv4patch.checkout.applying", "dsv4patch.checkout.resolving", "dsv4patch.checkout.transaction",
         "dsv4patch.checkout.conflicts", "dsv4patch.delivery", "dsv4patch.forks.porting",
         "dsv4patch.forks.refreshing", "dsv4patch.index", "dsv4patch.pins.fetching", "dsv4patch.proofs",
         "dsv4patch.zipcopy")


# Runs the CLI as ``python -m dsv4patch`` does and, when the interpreter exits, writes the
# names in sys.modules to the file named first on the command line.
LIST_MODULES = """\
import atexit, json, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = "dsv4patch"
runpy.run_module("dsv4patch", run_name="__main__", alter_sys=True)
"""


def imported(*args: str | Path, cwd: Path) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The modules a fresh ``python -m dsv4patch ARGS`` had imported when it exited, and the run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    listing = cwd / "modules.json"
    listing.unlink(missing_ok=True)
    res = subprocess.run([sys.executable, "-c", LIST_MODULES, str(listing), *map(str, args)],
                         capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    return set(json.loads(listing.read_text())), res


def heavy(names: set[str]) -> list[str]:
    """The modules of ``names`` in HEAVY or inside a package HEAVY names (delivery, proofs)."""
    return sorted(n for n in names if any(n == h or n.startswith(h + ".") for h in HEAVY))


def test_version_imports_no_command(tmp_path: Path) -> None:
    """``--version`` alone imports nothing of the CLI (not even its parser, issue 39) and prints what the
    parser's version action prints; with anything else on the line the parser answers, no command imported."""
    names, res = imported("--version", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout == f"dsv4patch {__version__}\n" and res.stderr == "", res.stderr
    # the package alone (its __main__ runs as the module __main__, as `python -m dsv4patch` and the console
    # script run it)
    assert sorted(n for n in names if n.startswith("dsv4patch")) == ["dsv4patch"]
    assert "argparse" not in names
    names, res = imported("--version", "--debug", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout == f"dsv4patch {__version__}\n", res.stderr
    assert "dsv4patch.main" in names
    assert sorted(n for n in names if n.startswith("dsv4patch.commands")) == []
    assert heavy(names) == []


def test_version_to_a_closed_stdout_exits_141_without_a_traceback(tmp_path: Path) -> None:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the version is written
    try:
        res = subprocess.run([sys.executable, "-m", "dsv4patch", "--version"], stdout=w, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, timeout=60)
    finally:
        os.close(w)
    assert res.returncode == 141 and res.stderr == "", res.stderr


# What a parser prints that lives below commands/: verify's --upstream-from default, from a module
# that holds only it (not proofs.upstream_tests, which imports the test environments it runs in).
PRINTED = {"verify": {"dsv4patch.proofs", "dsv4patch.proofs.upstream_release"}}


def test_help_lists_every_command_and_imports_none_of_their_machinery(tmp_path: Path) -> None:
    """The top-level --help imports every command module (to list them) but none of the core they
    run: a command imports its core inside run()."""
    from dsv4patch.main import COMMANDS

    names, res = imported("--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert all(f"    {c}" in res.stdout for c in COMMANDS)
    assert {f"dsv4patch.commands.{c}" for c in COMMANDS} <= names
    assert sorted(set(heavy(names)) - set().union(*PRINTED.values())) == []
    assert not {"dsv4patch.checkout", "dsv4patch.forks", "dsv4patch.series.pincheck"} & names


@pytest.mark.parametrize("argv", [[], ["--debug"]])
def test_no_command_names_every_command_with_its_help_and_exits_2(tmp_path: Path, argv: list[str]) -> None:
    """A bare ``dsv4patch`` (a new user's first try): exit 2, stdout empty, and stderr lists each command
    with its one-line help (as --help does) and says how to get one's options, then the usage line."""
    from dsv4patch.main import COMMANDS

    res = subprocess.run([sys.executable, "-m", "dsv4patch", *argv], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "100"})
    assert res.returncode == 2 and res.stdout == "", res
    head, *rest = res.stderr.splitlines()
    assert head == "dsv4patch: error: no command given; the commands (`dsv4patch COMMAND --help` for one's options):"
    assert [line.split()[0] for line in rest if line.startswith("    ") and not line.startswith("     ")] == \
        list(COMMANDS)
    assert rest[0].startswith("    check     check that each pin's patch series applies as the lock expects")
    assert rest[-1] == "usage: dsv4patch [-h] [--version] [--debug] COMMAND ..."
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(("typed", "meant"), [("chek", "check"), ("aply", "apply"), ("selftets", "selftest"),
                                              ("releses", "releases"), ("xyz", None), ("\x1b[31mcheck", None)])
def test_a_mistyped_command_names_the_nearest_one(tmp_path: Path, typed: str, meant: str | None) -> None:
    res = subprocess.run([sys.executable, "-m", "dsv4patch", typed, "--pin", "0.27.1"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stdout == "", res
    first = res.stderr.splitlines()[0]
    assert first.startswith("dsv4patch: error: argument COMMAND: invalid choice: "), first
    assert first.endswith(f"; did you mean {meant!r}?") if meant else "did you mean" not in first, first
    assert "\x1b" not in res.stderr  # the typed name is shown escaped


@pytest.mark.parametrize(("argv", "hint"), [(["check", "--pinn", "0.27.1"], "; did you mean --pin?"),
                                            (["status", "--instaled"], "; did you mean --installed?"),
                                            (["check", "--formt=json"], "; did you mean --format?"),
                                            (["check", "--zzz"], ""), (["check", "stray"], "")])
def test_an_unknown_option_names_the_commands_usage_and_nearest_option(tmp_path: Path, argv: list[str],
                                                                       hint: str) -> None:
    """An unknown option is reported against the command it was given to (that command's usage line, not
    the top level's), with the nearest option that command has; exit 2, nothing on stdout."""
    res = subprocess.run([sys.executable, "-m", "dsv4patch", *argv], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 2 and res.stdout == "", res
    first, usage, *_ = res.stderr.splitlines()
    assert first == f"dsv4patch {argv[0]}: error: unrecognized arguments: {' '.join(argv[1:])}{hint}", first
    assert usage.startswith(f"usage: dsv4patch {argv[0]} [-h]"), usage


def test_an_unknown_option_with_format_json_is_one_json_error(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "dsv4patch", "check", "--pinn", "0.27.1", "--format", "json"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 2
    err = json.loads(res.stdout)["error"]
    assert err["kind"] == "usage" and err["command"] == "check" and err["exit_code"] == 2
    assert err["message"].startswith("unrecognized arguments: --pinn 0.27.1; did you mean --pin?\nusage: dsv4patch check")


@pytest.mark.parametrize("command", ["check", "apply", "status", "verify", "build", "wheel", "lock", "fetch", "port",
                                     "resolve", "refresh", "selftest", "releases"])
def test_a_commands_help_imports_that_command_and_what_it_prints(tmp_path: Path, command: str) -> None:
    from dsv4patch.main import COMMANDS

    assert command in COMMANDS
    names, res = imported(command, "--help", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith(f"usage: dsv4patch {command}"), res.stderr
    assert sorted(n for n in names if n.startswith("dsv4patch.commands.")) == sorted(
        {"dsv4patch.commands._common", f"dsv4patch.commands.{command}"})
    assert sorted(set(heavy(names)) - PRINTED.get(command, set())) == []
    assert not {"dsv4patch.checkout", "dsv4patch.forks", "dsv4patch.series"} & (names - PRINTED.get(command, set()))


def _check_args(tmp_path: Path, upstream, fmt: str) -> tuple[str | Path, ...]:
    """``check`` of a one-patch lock on a git pin of the mini upstream, in its own cache under ``tmp_path``."""
    d = tmp_path / "lock"
    d.mkdir()
    upstream.patch(d / "0001-a.patch", "a", {"vllm/envs.py": MINI_FILES["vllm/envs.py"] + "A = 1\n"}, "a")
    lock = write_lock(d / "l.toml", {"p": git_pin("p", upstream)}, {"main": ["0001-a.patch"]})
    return ("check", "--lock", lock, "--cache-dir", tmp_path / "cache", "--format", fmt)


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_check_imports_no_build_wheel_or_selftest_machinery(tmp_path: Path, upstream, fmt: str) -> None:
    args = _check_args(tmp_path, upstream, fmt)
    for run in ("cold", "warm"):  # cold: the pin is fetched, its tree made, the series checked
        names, res = imported(*args, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert "dsv4patch.series.pincheck" in names, run
        assert heavy(names) == [], run
        # _words: the command line's spelling of the core's parameters and next steps (main installs it)
        assert sorted(n for n in names if n.startswith("dsv4patch.commands.")) == [
            "dsv4patch.commands._common", "dsv4patch.commands._words", "dsv4patch.commands.check"], run
        if run == "warm":  # the result from the check cache: no patch parsed, no checkout guarded (issue 39)
            assert not {"dsv4patch.series.patches", "dsv4patch.guard"} & names, run
            # nor the standard library only a run that writes a temporary name or a work directory needs
            # (secrets, with hmac; tempfile): a warm check makes neither (rich's style imports random)
            assert not {"secrets", "tempfile", "hmac"} & names, (run, {"secrets", "tempfile", "hmac"} & names)


def test_status_installed_imports_no_kernel_build_or_checkout_machinery(tmp_path: Path, upstream) -> None:
    """``status --installed`` reads an install: neither the kernel build (it needs the kernel wheel's name,
    member limit and hook line, ``kernels/identity.py``) nor a tree's status and conflict machinery."""
    lock = _check_args(tmp_path, upstream, "json")[2]
    for extra in ((), ("--lock", lock)):  # no lock here (the SBOM's check), and the lock's full check
        names, res = imported("status", "--installed", "--format", "json", *extra, cwd=tmp_path)
        assert res.returncode in (0, 1), res.stderr
        assert "dsv4patch.delivery.installed" in names, extra
        assert not {n for n in names if n.startswith(("dsv4patch.checkout", "dsv4patch.kernels.build",
                                                      "dsv4patch.kernels.sources", "dsv4patch.kernels.building",
                                                      "dsv4patch.kernels.toolchain"))}, (extra, sorted(names))


# Runs the CLI as the console script does and writes, when the interpreter exits, the collections that ran
# while the program started (from the import of dsv4patch.main, which the entry point starts, to the freeze of
# what the start-up made) and after, whether the collector is on, and how many objects the start-up left frozen.
WATCH_GC = """\
import atexit, gc, json, runpy, sys
out = sys.argv.pop(1)
seen = {"starting": 0, "running": 0}
def watch(phase, info):
    if phase == "start" and "dsv4patch.main" in sys.modules:
        seen["running" if gc.get_freeze_count() else "starting"] += 1
gc.callbacks.append(watch)
atexit.register(lambda: open(out, "w").write(json.dumps({**seen, "enabled": gc.isenabled(),
                                                          "frozen": gc.get_freeze_count()})))
sys.argv[0] = "dsv4patch"
runpy.run_module("dsv4patch", run_name="__main__", alter_sys=True)
"""


def test_no_collection_while_the_program_starts_and_the_collector_on_for_the_run(tmp_path: Path, upstream) -> None:
    """issue 39: the ~20 collections a start-up set off walked objects that live as long as the process;
    the entry point keeps the collector off until the command is about to run, then freezes what the
    start-up made and turns it on.  ``main()`` called in-process (tests, embedders) leaves it alone."""
    import gc

    from dsv4patch.main import main

    args = _check_args(tmp_path, upstream, "json")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for run in ("cold", "warm"):
        res = subprocess.run([sys.executable, "-c", WATCH_GC, str(tmp_path / "gc.json"), *map(str, args)],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert res.returncode == 0, res.stderr
        seen = json.loads((tmp_path / "gc.json").read_text())
        assert seen["starting"] == 0 and seen["enabled"] is True, (run, seen)
        assert seen["frozen"] > 10_000, (run, seen)  # the modules, classes and functions of the start-up
    enabled, frozen = gc.isenabled(), gc.get_freeze_count()
    assert main([str(a) for a in args]) == 0
    assert (gc.isenabled(), gc.get_freeze_count()) == (enabled, frozen)

