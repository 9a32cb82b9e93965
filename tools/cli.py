"""The ``swin`` command: one subcommand per task."""

from __future__ import annotations

import argparse
import sys

from ..registry import UnknownModelError
from . import models

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swin", description="Swin Transformer backbones: models, costs, weights.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="registered architectures")
    p.add_argument("pattern", nargs="?", help="shell-style filter, e.g. 'swin_b*'")
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table")
    p.set_defaults(func=models.cmd_list)

    p = sub.add_parser("info", help="configuration, parameters and stages of one architecture")
    p.add_argument("name", help="registered name or timm alias, e.g. swin_t")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=models.cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UnknownModelError as error:
        print(f"swin {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
