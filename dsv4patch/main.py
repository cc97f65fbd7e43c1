"""Command line: parse arguments, dispatch to ``commands/<verb>.py``, map errors to exit codes.

Every subcommand module exposes ``add_parser`` and ``run(args) -> exit code``.
This module is the one place that turns an exception into an exit code: a
:class:`~dsv4patch.errors.Dsv4Error` into its documented code and message,
anything else into "internal error" (70) with a one-line message (the
traceback only with ``--debug`` or ``DSV4PATCH_DEBUG=1``).  With
``--format json`` an error is also printed as one JSON object on stdout.

It is also the one place that handles interrupts and a closed stdout: the
whole run is inside :func:`dsv4patch.childproc.interrupts`, so SIGINT, SIGTERM
or SIGHUP (to the process or its group, on a terminal or not) become exit 130
with "interrupted" after every ``finally`` has removed its temporary files and
every child tree is ended (then the cache work directories and partial files
the run still owns are removed: :func:`dsv4patch.store.remove_owned`,
:func:`dsv4patch.safeio.remove_partials`); a reader that closed stdout (``| head -c 0``) ends
the run with exit 141 and no traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import select
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from dsv4patch import __version__, childproc, face, report, settings
from dsv4patch.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    Dsv4Error,
    UsageError,
    did_you_mean,
)
from dsv4patch.report import SCHEMA_VERSION, literal
from dsv4patch.settings import Settings

COMMANDS = ("check", "apply", "status", "verify", "build", "wheel", "lock", "fetch", "port", "resolve", "refresh",
            "selftest", "releases")

EPILOG = """\
exit codes:
  0    success: every result is what the lock expects
  1    a result differs from the lock (unexpected patch status, tree id, failed proof;
       status --installed: a file that is not the patched one, a link, FIFO or too large)
  2    bad command line, option value or environment variable (DSV4PATCH_LOCK_TIMEOUT,
       DSV4PATCH_DOWNLOAD_TIMEOUT, DSV4PATCH_DOWNLOAD_MIN_RATE, DSV4PATCH_GIT_TIMEOUT:
       finite and in range; a checkout path holding a newline), or a
       --python that cannot be started or whose answers are not a Python's
  3    bad lock file or patch file (malformed, not UTF-8, unknown keys, refused URL,
       unsafe paths, names or content; a --resolutions entry that is a link)
  4    a pinned source could not be fetched or verified (an index page of the wrong shape
       or over 32 MiB, a download past the lock's size or DSV4PATCH_DOWNLOAD_TIMEOUT or
       slower than DSV4PATCH_DOWNLOAD_MIN_RATE, a stock wheel whose RECORD lies or
       whose members link or inflate past their size),
       or the cache is unusable or full (check offline: cached pins are still reported,
       the others marked not-fetched)
  5    the target tree is dirty, at another commit or not a tree of the pin named (status
       too), not a dsv4patch tree, has unsafe git settings (drivers, rewriting
       attributes: also in included files, submodules, a worktree's common .git; a
       partial clone; not SHA-1), lacks an object git needs, or has a
       link, FIFO or malformed state file in .git where
       dsv4patch reads or writes, has an untracked or ignored file (or an edit hidden
       by assume-unchanged or skip-worktree) where the series writes, holds changes an interrupted apply did not make, or cannot be written
       (check: a local pin's checkout not at its commit is marked source-moved, the
       other pins are still checked)
  6    another dsv4patch run holds the cache or tree lock (DSV4PATCH_LOCK_TIMEOUT)
  7    kernel build or test environment failed (or a --kernels wheel of the wrong shape)
  8    a program dsv4patch ran (nvcc, a --python, pip, pytest, git) did not finish within its
       deadline, printed far more than it may, or could not be started; it was ended
       with every process it started (docs/trust.md#bounds)
  70   internal error (a bug, or git failing unexpectedly): please report it with the
       output of --debug (or DSV4PATCH_DEBUG=1), which adds the traceback
  130  interrupted (SIGINT, SIGTERM or SIGHUP: Ctrl-C, `timeout`, a CI cancel); temporary
       files are removed, child programs ended; the next apply finishes the interrupted one
  141  stdout was closed by its reader (`| head`): nothing more is printed
"""


_INVALID_COMMAND = re.compile(r"argument COMMAND: invalid choice: '(.*)' \(choose from ")


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line raises UsageError (so --format json can report it)."""

    commands: Mapping[str, argparse.ArgumentParser] = {}  # the top parser's: each command's (build_parser)

    def error(self, message: str) -> NoReturn:
        if message.endswith("required: COMMAND"):  # a bare `dsv4patch`: name the commands, as --help does
            lines = self.format_help().splitlines()
            start = lines.index("  COMMAND") + 1 if "  COMMAND" in lines else len(lines)
            block = lines[start:lines.index("", start)] if "" in lines[start:] else lines[start:]
            message = "no command given; the commands (`dsv4patch COMMAND --help` for one's options):\n" + \
                "\n".join(block)
        typo = _INVALID_COMMAND.match(message)
        if typo:  # a mistyped command: the nearest one, if any is near
            message += did_you_mean([typo.group(1)], COMMANDS, quote=True, sep=" ")
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}")

    def parse_command_line(self, argv: Sequence[str]) -> argparse.Namespace:
        """``parse_args``, but an unknown option is reported with the usage of the command it was given to
        and the nearest option that command has (``check --pinn``: did you mean ``--pin``?)."""
        args, extra = self.parse_known_args(argv)
        if extra:
            command = self.commands.get(getattr(args, "command", "") or "", self)
            message = f"unrecognized arguments: {' '.join(extra)}"
            options = [s for action in command._actions for s in action.option_strings]
            message += did_you_mean([a.split("=", 1)[0] for a in extra if a.startswith("-")], options, sep=" ")
            raise UsageError(f"{message}\n{command.format_usage().rstrip()}")
        return args


def build_parser(only: str | None = None) -> _Parser:
    """The parser; with ``only``, just that subcommand's (so a run imports only its command); with
    ``only=""``, none (``--version`` imports no command)."""
    parser = _Parser(
        prog="dsv4patch",
        description="Apply the DeepSeek-V4 sparse-MLA fixes to pinned vLLM trees.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dsv4patch {__version__}")
    debug_help = "on an internal error, print the traceback (also DSV4PATCH_DEBUG=1)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.commands = sub.choices
    for name in (only,) if only in COMMANDS else () if only == "" else COMMANDS:
        module = face.load(f"dsv4patch.commands.{name}")
        module.add_parser(sub)
    for p in sub.choices.values():
        p.epilog = EPILOG
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    return parser


def _wants_json(argv: Sequence[str], args: argparse.Namespace | None) -> bool:
    if args is not None:
        return getattr(args, "format", None) == "json"
    # The command line did not parse: look for the option by hand.
    items = list(argv)
    for i, a in enumerate(items):
        if a == "--format=json" or (a == "--format" and i + 1 < len(items) and items[i + 1] == "json"):
            return True
    return False


def _report(
    command: str, kind: str, message: str, code: int, as_json: bool, extra: dict[str, Any] | None = None
) -> int:
    from dsv4patch.urls import redact_text  # credentials in any URL a message quotes: never printed

    message = redact_text(message)
    extra = {k: redact_text(v) if isinstance(v, str) else v for k, v in (extra or {}).items()}
    prog = f"dsv4patch {command}" if command else "dsv4patch"
    # A message quotes pins, paths and patch text: control characters are shown escaped.
    print(literal(f"{prog}: error: {message}".rstrip()), file=sys.stderr)
    if as_json and not report.result_emitted():  # after the result, stdout keeps that one document
        err: dict[str, Any] = {"kind": kind, "message": message, "exit_code": code,
                               "command": command or None}
        err.update(extra or {})
        json.dump({"schema_version": SCHEMA_VERSION, "error": err}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        sys.stdout.flush()
    return code


def _stdout_closed() -> bool:
    """Has stdout's reader gone (a pipe whose read end is closed)?"""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _silence_stdout() -> None:
    """After a broken pipe: stdout goes to /dev/null, so the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: Sequence[str] | None = None, *, early: Sequence[int] = (),
         started: Callable[[], object] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); the exit code.

    ``early``: the interrupt signals that arrived before this was called (the
    entry point ``dsv4patch.__main__`` records them from its first instant).
    ``started``: called once the command line is parsed and its command imported,
    just before the command runs (the entry point turns the garbage collector
    back on there).
    """
    entry = argv is None  # the process's entry point (console script, python -m): it exits after this
    argv = list(sys.argv[1:] if argv is None else argv)
    state: dict[str, Any] = {"command": "", "args": None}
    report.reset_emitted()
    try:
        with settings.in_effect(Settings.for_output(os.environ)), childproc.interrupts(exiting=entry, early=early):
            return _main(argv, state, started)
    except KeyboardInterrupt:  # an interrupt that arrived while an error was reported or children ended
        return _interrupted(state["command"], _wants_json(argv, state["args"]))
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    finally:
        _remove_work_dirs()


def _remove_work_dirs() -> None:
    """The cache work directories the run still owns and the partial files it left (its child programs
    have ended): removed, so an interrupt that landed between one's creation and the ``try`` that
    removes it leaves none."""
    for name, remove in (("dsv4patch.store", "remove_owned"), ("dsv4patch.safeio", "remove_partials")):
        module = sys.modules.get(name)  # not imported: the run made none (start-up stays light)
        if module is not None:
            getattr(module, remove)()


# What to do after an interrupt (exit 130): apply's rerun finishes or refuses what it began
# (docs/how-it-works.md#interrupted-runs); every command removed its temporary files and ended its children.
_RERUN = {"apply": "run the same apply again: it finishes the interrupted one or refuses, touching nothing"}


def _interrupted(command: str, as_json: bool) -> int:
    what = _RERUN.get(command, "its temporary files were removed: run the command again")
    try:
        return _report(command, "interrupted", f"interrupted; {what}", EXIT_INTERRUPTED, as_json)
    except OSError:  # stdout or stderr closed as well
        return EXIT_INTERRUPTED


def _main(argv: list[str], state: dict[str, Any], started: Callable[[], object] | None) -> int:
    args: argparse.Namespace | None = None
    command = ""
    debug = os.environ.get("DSV4PATCH_DEBUG", "") not in ("", "0")
    try:
        first = next((a for a in argv if not a.startswith("-")), None)
        if first is None and "--version" in argv and not {"-h", "--help"} & set(argv):
            first = ""  # only the version: no command module is imported
        args = build_parser(first).parse_command_line(argv)
        state["args"] = args
        command = state["command"] = args.command
        debug = debug or bool(args.debug)  # the top parser defaults it, a subcommand may set it
        _use_words()
        module = face.load(f"dsv4patch.commands.{args.command}")
        if started is not None:
            started()
        # The environment's settings, read and validated once for the run (a bad bound: exit 2 here).
        with settings.in_effect(Settings.from_environ(os.environ)):
            code = int(module.run(args))
        sys.stdout.flush()  # a closed stdout is found here, not in the interpreter's last flush
        return code
    except Dsv4Error as exc:
        if debug:
            import traceback  # only for an error (start-up imports only what the run needs)

            traceback.print_exc()
        command = command or next((a for a in argv if a in COMMANDS), "")
        _use_words()
        return _report(command, exc.kind, report.words(str(exc)), exc.exit_code, _wants_json(argv, args))
    except KeyboardInterrupt:
        return _interrupted(command, _wants_json(argv, args))
    except BrokenPipeError as exc:
        if exc.errno == errno.EPIPE and _stdout_closed():
            _silence_stdout()
            return EXIT_BROKEN_PIPE
        return _internal(exc, command, debug, argv, args)
    except Exception as exc:  # a bug: one line, the traceback only on request
        if _from_interrupt(exc):
            return _interrupted(command, _wants_json(argv, args))
        return _internal(exc, command, debug, argv, args)


def _from_interrupt(exc: BaseException) -> bool:
    """An exception that wraps an interrupt is the interrupt: Python 3.11 turns an exception raised in a
    descriptor's ``__set_name__`` into a ``RuntimeError`` (a signal that lands while a dataclass is made,
    as a module the command needs loads, did so in the suite's random-interrupt test), and an error
    raised while unwinding from one carries it as its context."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _use_words() -> None:
    """Install the command line's words into the output layer, before a command runs (and before an
    error is shown): every path to the user then renders the parameters and next steps the core names
    (``--version`` alone imports no command module, so not at import)."""
    from dsv4patch.commands import _words

    report.use_words(_words.render)


def _internal(exc: Exception, command: str, debug: bool, argv: list[str], args: argparse.Namespace | None) -> int:
    import traceback  # only for an error (start-up imports only what the run needs)

    if debug:
        traceback.print_exc()
    where = traceback.extract_tb(exc.__traceback__)[-1]
    message = (
        f"internal error (a bug in dsv4patch, please report it): {type(exc).__name__}: {exc} "
        f"[{os.path.basename(where.filename)}:{where.lineno}]"
        + ("" if debug else "; rerun with --debug or DSV4PATCH_DEBUG=1 for the traceback")
    )
    return _report(command, "internal", message, EXIT_INTERNAL, _wants_json(argv, args),
                   {"exception": type(exc).__name__})


if __name__ == "__main__":
    raise SystemExit(main())
