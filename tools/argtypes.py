"""argparse types the commands share: checked while the command line is parsed, before any work."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["whole_number"]


def whole_number(least: int, most: int | None = None, says: str | None = None, then: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number from ``least`` (to ``most``). Anything else is refused with
    ``"{says}, got '{value}'{then}"`` (``says`` by default: "takes a whole number of at least {least}")."""
    says = says or f"takes a whole number of at least {least}"

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < least or (most is not None and number > most):
            raise argparse.ArgumentTypeError(f"{says}, got {value!r}{then}")
        return number

    return parse
