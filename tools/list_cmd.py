"""``swin list`` and ``swin info``: what is registered, and what one architecture is."""

from __future__ import annotations

import fnmatch
import json
import sys

from ..registry import describe_window, get_config, list_models, resolve_name
from ..registry.params import count_parameters

__all__ = ["matching_models", "model_rows", "cmd_list", "cmd_info", "register"]


def matching_models(pattern: str | None) -> list[str]:
    """Architectures matching a shell-style pattern on their name or a timm alias; with a dot, on
    ``NAME.TAG`` too (``'*.ms_in22k'``: those with ImageNet-22K weights)."""
    if pattern is None or "." not in pattern:
        return list_models(pattern)
    from ..weights import manifest

    arch_pattern, _, tag_pattern = pattern.partition(".")
    return [
        name
        for name in list_models(arch_pattern)
        if any(fnmatch.fnmatchcase(tag, tag_pattern) for tag in manifest.tags(name))
    ]


def model_rows(pattern: str | None = None) -> list[dict]:
    rows = []
    for name in matching_models(pattern):
        config = get_config(name)
        rows.append(
            {
                "name": name,
                "aliases": list(config.aliases),
                "img_size": list(config.img_size),
                "window_size": config.window_size,
                "embed_dim": config.embed_dim,
                "depths": list(config.depths),
                "num_heads": list(config.num_heads),
                "params": count_parameters(config),
            }
        )
    return rows


def cmd_list(args) -> int:
    if getattr(args, "pretrained", False):
        from .download_cmd import cmd_list_pretrained

        return cmd_list_pretrained(args)
    rows = model_rows(args.pattern)
    if not rows:
        print(
            f"swin list: no model matches {args.pattern!r} (names and timm aliases; see `swin list`)", file=sys.stderr
        )
        return 1
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    elif args.format == "markdown":
        print("| model | timm name | input | window | C | depths | heads | params |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['name']} | {', '.join(r['aliases'])} | {r['img_size'][0]}x{r['img_size'][1]} "
                f"| {describe_window(r['window_size'])} | {r['embed_dim']} | {r['depths']} | {r['num_heads']} "
                f"| {r['params']:,} |"
            )
    else:
        table = [
            (
                r["name"],
                f"{r['img_size'][0]}x{r['img_size'][1]}",
                describe_window(r["window_size"]),
                f"{r['params'] / 1e6:.2f}M",
                ", ".join(r["aliases"]),
            )
            for r in rows
        ]
        print_table(("model", "input", "window", "params", "timm name"), table, right=(2, 3))
    return 0


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]], right: tuple[int, ...] = ()) -> None:
    """Columns as wide as their widest cell (numbers in ``right`` columns aligned right)."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        print("  ".join(cells).rstrip())


def cmd_info(args) -> int:
    name = resolve_name(args.name)
    config = get_config(name)
    info = {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.to_dict().items()}
    info["params"] = count_parameters(config)
    info["gmacs"] = round(analytic_gmacs(name), 3)
    info["tags"] = _tags(name)
    sizes, windows = config.stage_sizes(), config.stage_windows()
    info["stages"] = [
        {
            "stage": i + 1,
            "resolution": list(sizes[i]),
            "channels": config.embed_dim * 2**i,
            "depth": depth,
            "window": list(windows[i]),
        }
        for i, depth in enumerate(config.depths)
    ]
    if args.format == "json":
        print(json.dumps(info, indent=2))
        return 0
    print(f"{name}" + (f" (aliases: {', '.join(config.aliases)})" if config.aliases else ""))
    if config.version == 2:  # V1 is the default these fields describe
        print(f"  {'version':<15} 2 (Swin V2: pretrained_window_sizes {list(config.pretrained_window_sizes)})")
    for key in (
        "img_size",
        "patch_size",
        "window_size",
        "embed_dim",
        "depths",
        "num_heads",
        "mlp_ratio",
        "num_classes",
        "drop_path_rate",
    ):
        print(f"  {key:<15} {describe_window(config.window_size) if key == 'window_size' else info[key]}")
    print(f"  {'params':<15} {info['params']:,}")
    height, width = config.img_size
    print(f"  {'GMACs':<15} {info['gmacs']:.2f} at {height}x{width} (multiply-adds; GFLOPs = 2 x GMACs)")
    if info["tags"]:
        print(
            "  pretrained tags (`swin list --pretrained` for all; load with create_model(NAME.TAG, pretrained=True)):"
        )
        rows = [
            (
                t["tag"] + (" (default)" if t["default"] else ""),
                f"{t['num_classes']} classes",
                "-" if t["top1"] is None else f"top-1 {t['top1']:.2f}",
            )
            for t in info["tags"]
        ]
        widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
        for row in rows:
            print("    " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    else:
        print("  pretrained tags: none (random weights, or create_model(..., pretrained=PATH_OR_URL))")
    for s in info["stages"]:
        h, w = s["resolution"]
        print(
            f"  stage {s['stage']}: {h}x{w} tokens, {s['channels']} channels, {s['depth']} "
            f"block{'' if s['depth'] == 1 else 's'}, window {s['window'][0]}x{s['window'][1]}"
        )
    return 0


def analytic_gmacs(name: str) -> float:
    """Multiply-adds (G) of one image at the architecture's own size, from the modules' analytic counts
    (built on the meta device: no memory, no initialisation)."""
    import torch

    from ..costs import analytic_macs
    from ..factory import create_model

    with torch.device("meta"):
        model = create_model(name)
    return analytic_macs(model, get_config(name).img_size)["total"] / 1e9


def _tags(name: str) -> list[dict]:
    from ..weights import manifest

    return [
        {
            "tag": entry.tag,
            "default": entry.default,
            "num_classes": entry.num_classes,
            "top1": entry.metrics.get("top1"),
            "top5": entry.metrics.get("top5"),
        }
        for entry in manifest.entries()
        if entry.arch == name
    ]


def register(sub) -> None:
    p = sub.add_parser("list", help="registered architectures")
    p.add_argument(
        "pattern",
        nargs="?",
        help="shell-style filter on names and timm aliases, e.g. 'swin_b*' or '*tiny*'; NAME.TAG patterns such as "
        "'*.ms_in22k' select architectures by pretrained tag",
    )
    p.add_argument(
        "--format", choices=("table", "markdown", "json"), default="table", help="output format (default: table)"
    )
    p.add_argument("--pretrained", action="store_true", help="list the pretrained checkpoints (ARCH.TAG) instead")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("info", help="configuration, parameters and stages of one architecture")
    p.add_argument("name", help="registered name or timm alias, e.g. swin_t")
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    p.set_defaults(func=cmd_info)
