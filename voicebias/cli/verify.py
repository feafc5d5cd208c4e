"""`voicebias verify [REV]`: do this checkout's outputs agree with REV's committed ones?"""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_verify(args: argparse.Namespace) -> int:
    from voicebias.verify import verify

    verdict = verify(args.rev, Path(args.repo), progress=not args.quiet)
    print(verdict.report(limit=args.limit))
    return verdict.exit_code


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `verify` on the command's subparsers."""
    p = sub.add_parser(
        "verify",
        help="compare this checkout's pipeline outputs with a revision's committed ones: "
        "identical, same results within tolerance (exit 0) or different results (exit 1)",
    )
    p.add_argument(
        "rev", nargs="?", default="HEAD", help="git revision whose dvc.lock names the outputs (default HEAD)"
    )
    p.add_argument("--repo", default=".", help="the project folder (default: the current one)")
    p.add_argument("--limit", type=int, default=10, help="how many differences to list (default 10)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_verify)
