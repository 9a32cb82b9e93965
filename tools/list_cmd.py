"""``swin list`` and ``swin info``: what is registered, and what one architecture is."""

from __future__ import annotations

import json

from ..registry import get_config, list_models, resolve_name
from ..registry.params import count_parameters

__all__ = ["model_rows", "cmd_list", "cmd_info", "register"]


def model_rows(pattern: str | None = None) -> list[dict]:
    rows = []
    for name in list_models(pattern):
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
        from .weights_cmds import cmd_list_pretrained

        return cmd_list_pretrained(args)
    rows = model_rows(args.pattern)
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    elif args.format == "markdown":
        print("| model | timm name | input | window | C | depths | heads | params |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['name']} | {', '.join(r['aliases'])} | {r['img_size'][0]}x{r['img_size'][1]} "
                f"| {r['window_size']} | {r['embed_dim']} | {r['depths']} | {r['num_heads']} | {r['params']:,} |"
            )
    else:
        for r in rows:
            print(
                f"{r['name']:<12} {r['img_size'][0]}x{r['img_size'][1]:<5} window {r['window_size']:<3} "
                f"params {r['params'] / 1e6:7.2f}M  ({', '.join(r['aliases'])})"
            )
    return 0


def cmd_info(args) -> int:
    name = resolve_name(args.name)
    config = get_config(name)
    info = {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.to_dict().items()}
    info["params"] = count_parameters(config)
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
        print(f"  {key:<15} {info[key]}")
    print(f"  {'params':<15} {info['params']:,}")
    for s in info["stages"]:
        h, w = s["resolution"]
        print(
            f"  stage {s['stage']}: {h}x{w} tokens, {s['channels']} channels, {s['depth']} blocks, "
            f"window {s['window'][0]}x{s['window'][1]}"
        )
    return 0


def register(sub) -> None:
    p = sub.add_parser("list", help="registered architectures")
    p.add_argument("pattern", nargs="?", help="shell-style filter, e.g. 'swin_b*'")
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table")
    p.add_argument("--pretrained", action="store_true", help="list the pretrained checkpoints (ARCH.TAG) instead")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("info", help="configuration, parameters and stages of one architecture")
    p.add_argument("name", help="registered name or timm alias, e.g. swin_t")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_info)
