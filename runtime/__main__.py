"""``python -m runtime <command>``: entry points that deploy artifacts run inside the image."""
from __future__ import annotations

import argparse
import sys

from runtime import selfcheck


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sc = sub.add_parser("selfcheck", help="Import ray and torch, load the baked cluster spec, print a JSON report.")
    sc.add_argument("--require-cuda", action="store_true", help="Fail unless torch is a CUDA build.")
    args = parser.parse_args(argv)
    if args.command == "selfcheck":
        return selfcheck.run(require_cuda=args.require_cuda)
    return 2


if __name__ == "__main__":
    sys.exit(main())
