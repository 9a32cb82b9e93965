"""The ``swin`` command: one subcommand per module, each with ``register(subparsers)``.

A subcommand's module is imported only when that subcommand runs (most import torch, which takes seconds):
``swin --help`` lists the commands from the table below, and ``swin list`` needs no torch at all.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pickle
import re
import sys

__all__ = ["COMMANDS", "build_parser", "main"]

# command -> (module that registers it, one line of help). Each module defines register(subparsers),
# adding its subcommands with set_defaults(func=...).
COMMANDS = {
    "list": ("list_cmd", "registered architectures"),
    "info": ("list_cmd", "configuration, parameters and stages of one architecture"),
    "flops": ("flops_cmd", "cost per stage (MSA against W-MSA) and of the whole model, analytic and measured"),
    "download": ("download_cmd", "fetch pretrained weights into the cache ($SWIN_HOME)"),
    "convert": ("convert_cmd", "rewrite a checkpoint in another layout"),
    "predict": ("predict_cmd", "classify an image with pretrained weights"),
    "validate": ("validate_cmd", "top-1/top-5 accuracy on an ImageFolder (ImageNet val layout)"),
    "export": ("export_cmd", "export a classifier or backbone to ONNX (.onnx) or torch.export (.pt2)"),
    "bench": ("bench", "time ours against timm and torchvision (same weights, interleaved)"),
    "show": ("show_cmd", "draw the windows, the cyclic shift, the region masks and where attention goes"),
}


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not an option), if it is one of ours."""
    words = iter(argv)
    for word in words:
        if word == "--models-file":  # the global option that takes a value
            next(words, None)
        elif not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _global_options_first(argv: list[str]) -> list[str]:
    """``argv`` with every ``--models-file YAML`` moved before the command, so the global option works on
    either side of it (``swin list --models-file m.yaml`` as ``swin --models-file m.yaml list``)."""
    front, rest, words = [], [], iter(argv)
    for word in words:
        if word == "--":  # what follows is positional
            rest += [word, *words]
        elif word == "--models-file":
            front.append(word)
            value = next(words, None)
            if value is not None:
                front.append(value)
        elif word.startswith("--models-file="):
            front.append(word)
        else:
            rest.append(word)
    return front + rest


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with the full arguments of ``command`` (its module's commands) and one-line stubs for the
    others; ``command=None``: stubs only (enough for ``swin --help`` and for naming a wrong command)."""
    parser = argparse.ArgumentParser(prog="swin", description="Swin Transformer backbones: models, costs, weights.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "--models-file",
        action="append",
        default=[],
        metavar="YAML",
        help="register the architectures of a YAML file (as registry/models.yaml) for this command; repeatable. "
        f"${MODELS_ENV} (paths separated by {os.pathsep!r}) does the same for every command",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    loaded = COMMANDS[command][0] if command else None
    for name, (module, help_text) in COMMANDS.items():
        if module != loaded:
            sub.add_parser(name, help=help_text)
    if loaded:
        importlib.import_module(f"{__package__}.{loaded}").register(sub)
    return parser


MODELS_ENV = "SWIN_MODELS"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("swin")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "(not installed)"


def _register_model_files(paths: list[str]) -> None:
    """Make user YAML architectures visible to the command: ``$SWIN_MODELS`` first, then ``--models-file``."""
    from_env = [p for p in os.environ.get(MODELS_ENV, "").split(os.pathsep) if p]
    if not from_env and not paths:
        return
    import yaml

    from ..registry import get_config, list_models, register_model

    for path in [*from_env, *paths]:
        origin = f"${MODELS_ENV}" if path in from_env else "--models-file"
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{origin}: {path} is not a file; give the path of a YAML file of architectures")
        before = {name: get_config(name) for name in list_models()}
        try:
            names = register_model(path, overwrite=True)
        except yaml.YAMLError as error:  # the user's file, not our failure: say where it breaks
            raise ValueError(f"{origin} {path}: not valid YAML {_yaml_problem(error)}; fix the file") from None
        changed = [name for name in names if name in before and get_config(name) != before[name]]
        if changed:  # allowed (a file may mean to), but never unnoticed: every command now builds the file's
            print(
                f"swin: {origin} {path} redefines {', '.join(changed)}, registered before with other fields; the "
                "commands use the file's definition",
                file=sys.stderr,
            )


def _yaml_problem(error: Exception) -> str:
    """Where and what a YAML syntax error is: ``at line 3, column 11: ...`` (lines counted from 1)."""

    def at(mark) -> str:
        return f"at line {mark.line + 1}, column {mark.column + 1}"

    problem, mark = getattr(error, "problem", None), getattr(error, "problem_mark", None)
    if problem is None or mark is None:  # a reader error (bytes that are not text) or another kind
        return ": " + " ".join(str(error).split())
    context, start = getattr(error, "context", None), getattr(error, "context_mark", None)
    opened = f" ({context} {at(start)})" if context and start is not None else ""
    return f"{at(mark)}: {problem}{opened}"


def _one_line(error: BaseException, limit: int = 600) -> str:
    """The error as one line: its message (a KeyError's without the quotes), cut at ``limit`` characters."""
    text = str(error.args[0] if isinstance(error, KeyError) and len(error.args) == 1 else error)
    if "Original Traceback" in text:  # re-raised from a DataLoader worker: its last line is the error itself
        last = text.strip().splitlines()[-1]
        text = re.sub(r"^[A-Za-z_][\w.]*: ", "", last)  # without the exception's (dotted) class name
    text = " ".join(text.split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    """Run the command line; every error becomes one line on stderr and a non-zero exit status
    (``SWIN_DEBUG=1`` lets the traceback through)."""
    argv = _global_options_first(sys.argv[1:] if argv is None else argv)
    try:  # building the parser imports the command's modules (torch: a second or more)
        args = build_parser(_command_of(argv)).parse_args(argv)
    except KeyboardInterrupt:
        command = _command_of(argv)
        print(f"swin {command}: interrupted" if command else "swin: interrupted", file=sys.stderr)
        return 130
    try:
        _register_model_files(args.models_file)
        status = args.func(args)
        sys.stdout.flush()  # inside the try: a closed pipe shows up here, not at interpreter exit
        return status
    except BrokenPipeError:
        # The reader went away (`swin list | head`): stop quietly, and keep the exit flush from failing too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"swin {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if os.environ.get("SWIN_DEBUG", "") not in ("", "0"):
            raise
        ours = isinstance(error, (KeyError, ValueError, TypeError, OSError, ImportError, pickle.UnpicklingError))
        kind = "" if ours else f"{type(error).__name__}: "
        hint = "" if ours else " (SWIN_DEBUG=1 shows the traceback)"
        print(f"swin {args.command}: {kind}{_one_line(error, limit=4000)}{hint}", file=sys.stderr)
        return 2 if isinstance(error, KeyError) else 1


if __name__ == "__main__":
    sys.exit(main())
