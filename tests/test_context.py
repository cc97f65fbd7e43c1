"""pins/context.py: one record for what a run's operations share, built once by the command line (issue 37)."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import pytest

from conftest import LOCK
from dsv4patch import childproc, settings
from dsv4patch.commands import _common
from dsv4patch.errors import Interrupted
from dsv4patch.main import build_parser
from dsv4patch.pins import Context, load_lock
from dsv4patch.progress import Progress
from dsv4patch.settings import Settings
from dsv4patch.store import Store


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    return Context(lock=load_lock(LOCK), store=Store.open(tmp_path / "cache"), progress=Progress(False))


def test_the_context_is_frozen_and_its_variants_share_the_rest(ctx: Context, tmp_path: Path) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.lock = load_lock(LOCK)  # type: ignore[misc]
    other = load_lock(LOCK)
    on = ctx.on(other)
    assert on.lock is other and on.store is ctx.store and on.progress is ctx.progress and on.settings is ctx.settings
    quiet = Progress(False)
    moved = ctx.reporting_to(quiet)
    assert moved.progress is quiet and moved.lock is ctx.lock and moved.store is ctx.store
    assert ctx.settings == Settings()  # a library caller that says nothing gets the built-in settings


def test_the_command_line_builds_it_from_the_options_and_the_run_s_settings(tmp_path: Path) -> None:
    """``--lock``, ``--cache-dir`` and ``--format`` into the record, with the settings ``main`` put in effect."""
    args = build_parser("check").parse_args(["check", "--lock", str(LOCK), "--cache-dir", str(tmp_path / "c"),
                                             "--format", "json"])
    mine = Settings(git_timeout=7.0)
    with settings.in_effect(mine):
        ctx = _common.context(args)
    assert ctx.lock.path == load_lock(LOCK).path and ctx.store.root == tmp_path / "c"
    assert ctx.settings is mine
    assert not ctx.progress.enabled  # JSON output: no live display on the terminal
    given = load_lock(LOCK)
    prog = Progress(False)
    again = _common.context(args, given, prog)
    assert again.lock is given and again.progress is prog


def test_a_bad_lock_is_reported_before_the_cache_is_opened(tmp_path: Path) -> None:
    """The record is opened lock first: a run with a broken lock never creates the cache."""
    bad = tmp_path / "l.toml"
    bad.write_text("schema = [\n")
    args = build_parser("check").parse_args(["check", "--lock", str(bad), "--cache-dir", str(tmp_path / "c")])
    with pytest.raises(Exception, match="l.toml"):
        _common.context(args)
    assert not (tmp_path / "c").exists()


def test_the_interrupt_state_is_the_run_s(ctx: Context) -> None:
    """A signal reaches the process, not one step: every context reads the same state, and a step can stop
    there with Interrupted (main turns it into exit 130)."""
    import os
    import time

    with childproc.interrupts():
        assert not ctx.interrupted()
        ctx.raise_if_interrupted()
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):  # the handler raises at the next bytecode at the latest
                time.sleep(0.01)
        assert ctx.interrupted() and ctx.on(ctx.lock).interrupted()
        with pytest.raises(Interrupted):
            ctx.raise_if_interrupted()
    with childproc.interrupts():  # the next run starts clean
        assert not ctx.interrupted()


def test_an_operation_takes_the_context_and_the_cli_output_is_unchanged(tmp_path: Path, cli, shared_cache) -> None:
    """The same operation through the core with a Context and through the CLI: one result."""
    from dsv4patch.series import check_pins

    lock = load_lock(LOCK)
    ctx = Context(lock=lock, store=Store.open(shared_cache), progress=Progress(False))
    pin = lock.pin("0.27.1")
    [outcome] = check_pins(ctx=ctx, pins=[pin])
    assert outcome.report is not None and outcome.report.ok
    res = cli("check", "--lock", LOCK, "--pin", "0.27.1", "--cache-dir", shared_cache, "--format", "json")
    assert res.rc == 0, res.err
    out = json.loads(res.out)
    shown = {k: v for k, v in out["pins"]["0.27.1"].items() if k != "cached"}  # the command adds where it came from
    assert out["ok"] is True and shown == outcome.report.to_json()
