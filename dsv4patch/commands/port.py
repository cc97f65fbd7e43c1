"""``dsv4patch port``: carry a pin's series to a new vLLM pin, as one reviewable change.

The port itself is :mod:`dsv4patch.forks.porting` (its conflict workspace
:mod:`dsv4patch.forks.portspace`); this command reads the options, calls
:func:`porting.port` and renders the result.  ``--verify`` then proves the
new pin as ``dsv4patch verify`` does (:func:`dsv4patch.proofs.verifying.verify`).
``--abort --workspace DIR`` gives a conflict workspace up (:func:`porting.abort`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dsv4patch import report
from dsv4patch.commands import _common
from dsv4patch.errors import EXIT_OK, EXIT_UNEXPECTED, UsageError

HELP = "port a pin's patch series to a new vLLM version or commit (adds the pin to the lock)"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("port", help=HELP, description=HELP)
    _common.add_lock(p, pins=False)
    p.add_argument("--to", default=None,
                   help="vLLM version on PyPI, or a 40-hex commit with --git (with --local: default HEAD)")
    p.add_argument("--git", default=None, help="git URL for --to COMMIT (instead of a PyPI sdist)")
    p.add_argument("--local", type=Path, default=None,
                   help="a clean local checkout (a fork) to port to, at --to or its HEAD")
    p.add_argument("--dry-run", action="store_true",
                   help="report what the port would do (keep, refresh, merge, drop) and write nothing; "
                        "--to a version that is already a pin: compare the port with that pin")
    p.add_argument("--from", dest="from_pin", default=None, help="pin to port from (default: the lock's default)")
    p.add_argument("--name", default=None, help="name of the new pin (default: the version/commit)")
    p.add_argument(
        "--resolutions", type=Path, default=None,
        help="a maintainer's earlier port (same file names): used where present, compared with the automatic port",
    )
    p.add_argument(
        "--workspace", type=Path, default=None, metavar="DIR",
        help="on a conflict, leave DIR (a new directory, or the fork's own checkout when porting to its "
             "HEAD: HEAD is then detached, no branch moves) as a tree of the new pin with the ported patches "
             "committed and the conflicting one merged (markers); after editing, run the same command again "
             "to go on",
    )
    p.add_argument("--abort", action="store_true",
                   help="with --workspace DIR: give its port up (the fork's own checkout goes back to the "
                        "commit and branch it was on); the lock is not read or written")
    p.add_argument("--verify", action="store_true", help="run dsv4patch verify on the new pin")
    p.add_argument("--torch", default=None, help="torch version for --verify's test venv")
    _common.add_output(p, markdown=True)
    _common.add_cache(p)


def run(args: argparse.Namespace) -> int:
    from dsv4patch.forks import abort_port, port
    from dsv4patch.pins import open_lock
    from dsv4patch.proofs import verify

    _common.refuse_newline("--workspace", args.workspace)
    _common.refuse_newline("--local", args.local)
    if args.abort:
        if args.workspace is None:
            raise UsageError("--abort needs --workspace DIR (the workspace to give up)")
        gone = abort_port(workspace=args.workspace)
        table, md = report.simple_table(f"dsv4patch port --abort ({gone.src} -> {gone.dst})",
                                        ["workspace", "head"],
                                        [[str(gone.workspace), (gone.head or "")[:12]]])
        report.emit(args.format, gone.to_json(), table, md)
        return EXIT_OK
    if args.resolutions is not None and not args.resolutions.is_dir():  # else every file "matches no patch"
        raise UsageError(f"--resolutions {args.resolutions}: "
                         f"{'is not a directory' if args.resolutions.exists() else 'does not exist'} "
                         f"(a relative path is from the current directory, {Path.cwd()})")
    lock = _common.open_lock(args)
    src = lock.pin(args.from_pin, given_as="from_pin")
    ctx = _common.context(args, lock)
    res = port(ctx=ctx, src=src, to=args.to, git_url=args.git,
               local=args.local, name=args.name, resolutions=args.resolutions,
               workspace=args.workspace, dry_run=args.dry_run)
    out = res.to_json()
    rows = [[n, v["action"], v["detail"]] for n, v in out["patches"].items()]
    table, md = report.simple_table(f"dsv4patch port {src.name} -> {res.pin.name}",
                                    ["patch", "action", "detail"], rows)
    report.emit(args.format, out, table, md)
    if res.ok and args.verify and not args.dry_run:
        written = open_lock(lock.path)  # with the new pin, as `dsv4patch verify` reads it
        proof = verify(ctx=ctx.on(written), pin=written.pin(res.pin.name, given_as=None), torch=args.torch)
        report.emit(args.format, proof.to_json(), *proof.table())
        return EXIT_OK if proof.ok else EXIT_UNEXPECTED
    return EXIT_OK if res.ok else EXIT_UNEXPECTED
