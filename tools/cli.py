"""The ``swin`` command: one subcommand per module, each with ``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib
import sys

from ..registry import UnknownModelError

__all__ = ["main", "build_parser"]

# Each module defines register(subparsers), adding its subcommands with set_defaults(func=...).
SUBCOMMAND_MODULES = ["models", "flops_cmd", "weights_cmds", "validate_cmd", "export_cmd", "bench"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swin", description="Swin Transformer backbones: models, costs, weights.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMAND_MODULES:
        importlib.import_module(f"{__package__}.{module}").register(sub)
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
