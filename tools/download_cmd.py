"""``swin download`` and ``swin list --pretrained``: the weights manifest from the shell."""

from __future__ import annotations

import json
import sys

from ..weights import manifest
from ..weights.download import DownloadError
from ..weights.pretrained import WeightsNotFoundError, fetch
from .cli import _one_line

__all__ = ["cmd_download", "cmd_list_pretrained", "pretrained_rows", "register"]


def _entries_for(names: list[str]) -> list[manifest.PretrainedEntry]:
    """``swin_t`` (default tag), ``swin_t.ms_in22k``, or a shell pattern over ARCH.TAG (``'swin_b*'``)."""
    found: list[manifest.PretrainedEntry] = []
    for name in names:
        if any(c in name for c in "*?["):
            matches = manifest.list_pretrained(name)
            if not matches:
                raise KeyError(f"no pretrained checkpoint matches {name!r}; see `swin list --pretrained`")
            found += [manifest.get_entry(m) for m in matches]
        else:
            found.append(manifest.get_entry(name))
    return list({e.name: e for e in found}.values())


def pretrained_rows(pattern: str | None = None) -> list[dict]:
    """One row per checkpoint: head, preprocessing, published accuracy, exact parameters and the GMACs of one
    image at its input size (computed; the published figure, where there is one, as ``published_gmacs``)."""
    from ..registry import get_config
    from ..registry.params import count_parameters
    from .list_cmd import analytic_gmacs

    gmacs: dict[str, float] = {}
    rows = []
    for name in manifest.list_pretrained(pattern):
        entry = manifest.get_entry(name)
        if entry.arch not in gmacs:
            gmacs[entry.arch] = analytic_gmacs(entry.arch)
        config = get_config(entry.arch)
        features = config.embed_dim * 2 ** (len(config.depths) - 1)
        head = (entry.num_classes - config.num_classes) * features / 1e9  # this checkpoint's head, not the default
        rows.append(
            {
                "name": name,
                "default": entry.default,
                "num_classes": entry.num_classes,
                "input_size": list(entry.input_size),
                "crop_pct": entry.crop_pct,
                "interpolation": entry.interpolation,
                "top1": entry.metrics.get("top1"),
                "top5": entry.metrics.get("top5"),
                "params": count_parameters(config.replace(num_classes=entry.num_classes)),
                "gmacs": round(gmacs[entry.arch] + head, 3),
                "published_gmacs": entry.metrics.get("gflops"),  # the papers' "FLOPs" are multiply-adds
                "cached": entry.cached_file() is not None,
                "sources": [s.describe() for s in entry.sources],
            }
        )
    return rows


def cmd_list_pretrained(args) -> int:
    from .list_cmd import print_table

    rows = pretrained_rows(args.pattern)
    if not rows:
        print(
            f"swin list: no pretrained checkpoint matches {args.pattern!r} (see `swin list --pretrained`)",
            file=sys.stderr,
        )
        return 1
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0

    def metric(value, spec=".2f"):
        return "-" if value is None else format(value, spec)

    header = ("checkpoint", "classes", "input", "crop", "top-1", "top-5", "params", "GMACs", "cached")
    cells = [
        (
            r["name"] + (" (default)" if r["default"] else ""),
            str(r["num_classes"]),
            f"{r['input_size'][1]}x{r['input_size'][2]}",
            f"{r['crop_pct']:.3f}",
            metric(r["top1"]),
            metric(r["top5"]),
            f"{r['params'] / 1e6:.2f}M",
            metric(r["gmacs"]),
            "yes" if r["cached"] else "no",
        )
        for r in rows
    ]
    if args.format == "markdown":
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in cells:
            print("| " + " | ".join(row) + " |")
    else:
        print_table(header, cells, right=(1, 3, 4, 5, 6, 7))
    print("GMACs: multiply-adds of one image at its input size (GFLOPs = 2 x GMACs); params: exact.", file=sys.stderr)
    return 0


def cmd_download(args) -> int:
    try:
        entries = _entries_for(args.names)
    except KeyError as error:
        print(f"swin download: {error.args[0]}", file=sys.stderr)
        return 2
    from ..factory import entry_model

    failed = 0
    for entry in entries:
        try:
            path = fetch(entry, model_for=entry_model)  # checked to be the entry's architecture
        except (WeightsNotFoundError, DownloadError) as error:
            print(f"swin download: {_one_line(error, limit=4000)}", file=sys.stderr)  # one line per failed name
            failed += 1
            continue
        print(f"{entry.name}: {path}")
    return 1 if failed else 0


def register(sub) -> None:
    p = sub.add_parser(
        "download",
        help="fetch pretrained weights into the cache ($SWIN_HOME)",
        description="Fetch pretrained checkpoints into the cache ($SWIN_HOME, default ~/.cache/swin), trying each "
        "source of the manifest in order; prints the cached path of each.",
    )
    p.add_argument("names", nargs="+", metavar="NAME[.TAG]", help="swin_t (default tag), swin_t.ms_in22k, 'swin_b*'")
    p.set_defaults(func=cmd_download)
