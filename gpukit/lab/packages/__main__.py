"""`python -m gpukit.lab.packages build|list`: the lab's local apt repository."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpukit.lab.packages import RepoError, build_repo, catalog, sources


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpukit.lab.packages", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or keep) the lab instance's apt repository")
    b.add_argument("--out", type=Path, help="directory (default: <state dir>/shared/apt)")
    b.add_argument("--force", action="store_true", help="rebuild even if nothing changed")
    sub.add_parser("list", help="list the stand-in packages")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            print(build_repo(args.out, force=args.force))
        else:
            for pkg in catalog.all_packages(sources()):
                print(f"{pkg.name} {pkg.version}")
    except RepoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
