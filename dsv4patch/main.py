"""Command line: parse arguments and dispatch to ``commands/<verb>.py``.

Nothing else happens here; every subcommand module exposes ``add_parser`` and
``run(args) -> exit code``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from dsv4patch import __version__
from dsv4patch.errors import Dsv4Error

COMMANDS = ("check", "apply", "status", "verify", "build", "lock", "fetch", "port")

EPILOG = """\
exit codes:
  0  success: every result is what the lock expects
  1  a result differs from the lock (unexpected patch status, tree id, failed proof)
  2  bad command line
  3  bad lock file or patch file (malformed, unknown keys, refused URL, unsafe paths or content)
  4  a pinned source could not be fetched or verified, or the cache is unusable
  5  the target tree is dirty, at another commit, not a dsv4patch tree, or has unsafe git settings
  6  another dsv4patch run holds the cache or tree lock (DSV4PATCH_LOCK_TIMEOUT)
  7  kernel build or test environment failed
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsv4patch",
        description="Apply the DeepSeek-V4 sparse-MLA fixes to pinned vLLM trees.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dsv4patch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"dsv4patch.commands.{name}")
        module.add_parser(sub)
    for p in sub.choices.values():
        p.epilog = EPILOG
        p.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(f"dsv4patch.commands.{args.command}")
    try:
        return int(module.run(args))
    except Dsv4Error as exc:
        print(f"dsv4patch {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
