"""The `ticklab` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__
from .claims import CLAIMS
from .paths import published_dir, repo_root, seeds_dir, traces_dir


def _report(args: argparse.Namespace) -> int:
    from .report import run_report

    return run_report(args.out, data_dir=args.data_dir, published_dir=args.published_dir, only=args.only,
                      cell_timeout=args.cell_timeout, notebook_timeout=args.notebook_timeout)


def _verify_published(args: argparse.Namespace) -> int:
    from .published import PublishedDataError, load_published, verify_against_source

    seeds = Path(args.seeds) if args.seeds else seeds_dir()
    unknown = [c for c in args.claims if c not in CLAIMS]
    if unknown:
        print(f"unknown claim(s) {', '.join(unknown)}; claims are: {', '.join(CLAIMS)}", file=sys.stderr)
        return 2
    status = 0
    for claim in args.claims or list(CLAIMS):
        try:
            published = load_published(args.published_dir, claim)
        except PublishedDataError as exc:
            print(f"{claim}: {exc}")
            status = 1
            continue
        rows = sum(len(t) for t in published.tables.values())
        if seeds is None:
            print(f"{claim}: {rows} rows load; source documents not found (set TICKLAB_SEEDS) so quotes are unchecked")
            continue
        problems = verify_against_source(published, seeds)
        for problem in problems:
            print(f"{claim}: {problem}")
        print(f"{claim}: {rows} rows, {'all quotes verbatim in ' + published.source['file'] if not problems else str(len(problems)) + ' problem(s)'}")
        status |= bool(problems)
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ticklab", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ticklab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    report = sub.add_parser("report", help="run every notebook with papermill and build the report")
    report.add_argument("--out", type=Path, default=repo_root() / "build", help="output directory (default: build/)")
    report.add_argument("--data-dir", type=Path, default=traces_dir(), help="where captured bundles live (default: traces/)")
    report.add_argument("--published-dir", type=Path, default=published_dir(), help="transcribed published numbers")
    report.add_argument("--only", nargs="+", metavar="NOTEBOOK", help="run only these notebooks (e.g. 03-hrtick)")
    report.add_argument("--cell-timeout", type=int, default=600, help="seconds one cell may run (default 600)")
    report.add_argument("--notebook-timeout", type=int, default=1800, help="seconds one notebook may run (default 1800)")
    report.set_defaults(func=_report)

    verify = sub.add_parser("verify-published", help="check the published layer against the source documents")
    verify.add_argument("claims", nargs="*", metavar="CLAIM", help=f"claims to check (default: all of {', '.join(CLAIMS)})")
    verify.add_argument("--published-dir", type=Path, default=published_dir())
    verify.add_argument("--seeds", help="directory of the source documents (default: $TICKLAB_SEEDS or ../shared/seeds)")
    verify.set_defaults(func=_verify_published)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
