"""Named architectures: the bundled YAML, user registrations, aliases and fuzzy error messages."""

from __future__ import annotations

import difflib
import fnmatch
import io
import os
import threading
from importlib import resources
from typing import Any

import yaml

from .config import SwinConfig

__all__ = ["UnknownModelError", "get_config", "list_models", "register_model", "resolve_name"]


class UnknownModelError(KeyError):
    """A model name that is neither registered nor an alias; the message names the closest ones."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"found {key!r} given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(text: str, source: str) -> Any:
    """The YAML in ``text``; an error's marks name ``source`` (the file) and its line."""
    stream = io.StringIO(text)
    stream.name = source  # what PyYAML names in its marks
    return yaml.load(stream, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)


_lock = threading.Lock()
_configs: dict[str, SwinConfig] = {}
_aliases: dict[str, str] = {}
_loaded = False


def _ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        text = resources.files(__package__).joinpath("models.yaml").read_text()
        _load_entries(_read_yaml(text, "models.yaml"), source="the bundled registry", overwrite=False)
        _loaded = True


def _load_entries(entries: Any, source: str, overwrite: bool) -> list[str]:
    if not isinstance(entries, dict):
        raise ValueError(f"{source}: expected a mapping of model name -> fields, got {type(entries).__name__}")
    configs = []
    for name, fields in entries.items():
        if not isinstance(fields, dict):
            raise ValueError(f"{source}: entry {name!r} must be a mapping of config fields")
        try:
            configs.append(SwinConfig().replace(name=name, **fields))
        except (TypeError, ValueError) as error:
            raise type(error)(f"{source}: entry {name!r}: {error}") from None
    _add(configs, overwrite, source)  # all or none: a file with a bad entry registers nothing
    return [config.name for config in configs]


def _add(configs: list[SwinConfig], overwrite: bool, source: str = "register_model") -> None:
    """Register ``configs`` together, after checking every name and alias: taken names (other than by the
    entry being replaced, with ``overwrite``) and names used twice are errors, and nothing is added."""
    global _configs, _aliases
    replaced = {config.name for config in configs if config.name in _configs} if overwrite else set()
    owners = {alias: owner for alias, owner in _aliases.items() if owner not in replaced}
    taken = set(_configs) - replaced | set(owners)
    new: set[str] = set()
    for config in configs:
        for spelling in (config.name, *(alias for alias in config.aliases if alias != config.name)):
            if spelling in new:
                raise ValueError(f"{source}: {spelling!r} is given twice; each name and alias must be unique")
            if spelling in taken:
                what = "name" if spelling in _configs else f"alias of {owners.get(spelling)!r}"
                replaceable = spelling == config.name and spelling in _configs
                hint = "pass overwrite=True to replace it" if replaceable else "choose another name"
                raise ValueError(f"{source}: {spelling!r} is already a registered {what}; {hint}")
            new.add(spelling)
    # new tables swapped in whole: readers (who take no lock) see the old ones or the new, never an alias
    # dropped in between (an entry replaced drops its old aliases)
    configs_after = dict(_configs)
    aliases_after = {alias: owner for alias, owner in _aliases.items() if owner not in replaced}
    for config in configs:
        configs_after[config.name] = config
        aliases_after.update({alias: config.name for alias in config.aliases if alias != config.name})
    _configs, _aliases = configs_after, aliases_after


def register_model(
    config: SwinConfig | dict[str, Any] | str | os.PathLike | None = None,
    *,
    overwrite: bool = False,
    **fields: Any,
) -> list[str]:
    """Add architectures to the registry; returns the names added.

    ``config`` is a :class:`SwinConfig`, a mapping of fields (with ``name``), or the path of a YAML file
    holding ``name: {fields}`` entries as in the bundled ``models.yaml``. Keyword fields build one entry.
    """
    _ensure_loaded()
    if fields and isinstance(config, (SwinConfig, str, os.PathLike)):
        raise TypeError(
            f"register_model got a {type(config).__name__} and fields {sorted(fields)}: give the fields in it "
            "(config.replace(...), or the YAML file), or pass them alone as keywords"
        )
    with _lock:
        if isinstance(config, (str, os.PathLike)):
            try:
                with open(config, encoding="utf-8") as handle:
                    text = handle.read()
            except UnicodeDecodeError as error:  # a binary file given by mistake: name it, not just the codec
                raise ValueError(
                    f"{os.fspath(config)}: not a YAML text file (not UTF-8 at byte {error.start}); give the "
                    "models file in the format of the bundled models.yaml"
                ) from None
            return _load_entries(_read_yaml(text, os.fspath(config)), source=os.fspath(config), overwrite=overwrite)
        if isinstance(config, dict):
            fields = {**config, **fields}
            config = None
        if config is None:
            if "name" not in fields:
                raise TypeError("register_model needs a name: register_model(name='my_swin', embed_dim=..., ...)")
            config = SwinConfig().replace(**fields)
        _add([config], overwrite)
        return [config.name]


def resolve_name(name: str) -> str:
    """Registered name for ``name`` or one of its aliases; ``KeyError`` naming the closest names otherwise."""
    _ensure_loaded()
    if not isinstance(name, str):
        raise TypeError(f"model name must be a str, got {type(name).__name__} {name!r}")
    if name in _configs:
        return name
    if name in _aliases:
        return _aliases[name]
    arch, dot, tag = name.partition(".")
    if dot and (arch in _configs or arch in _aliases):
        raise UnknownModelError(_tagged(name, _aliases.get(arch, arch), tag))
    known = sorted(_configs) + sorted(_aliases)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "."
    raise UnknownModelError(f"unknown model {name!r}{hint} Registered models: {', '.join(sorted(_configs))}")


def _tagged(name: str, arch: str, tag: str) -> str:
    """Why ``ARCH.TAG`` is refused where an architecture is expected. Whether TAG is one of the manifest's is
    not said: the manifest builds on the registry (``swin download --list`` or ``swin list --pretrained``
    shows the tags)."""
    return (
        f"{name!r} is an architecture followed by a tag ({tag!r}); here an architecture is expected: {arch!r} "
        "(tags of pretrained weights are for create_model, swin predict, validate, export and download; "
        f"swin list --pretrained '{arch}.*' lists {arch}'s)"
    )


def get_config(name: str) -> SwinConfig:
    """The registered :class:`SwinConfig` of ``name`` (an alias works too)."""
    registered = resolve_name(name)  # first: it may load the registry, which replaces the tables
    return _configs[registered]


def list_models(pattern: str | list[str] | tuple[str, ...] | None = None) -> list[str]:
    """Registered architecture names, sorted, filtered by a shell-style ``pattern`` if given: a name matches
    when it or one of its aliases does (``"*tiny*"`` finds ``swin_t`` through timm's name). As timm's filter: a
    list of patterns matches any of them, and ``""`` filters nothing."""
    _ensure_loaded()
    configs = _configs
    names = sorted(configs)
    if not pattern:
        return names
    patterns = [pattern] if isinstance(pattern, str) else pattern
    if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"list_models takes a pattern or a list of patterns (str), got {pattern!r}")
    spellings = {name: (name, *configs[name].aliases) for name in names}
    return [n for n in names if any(fnmatch.fnmatchcase(k, p) for p in patterns for k in spellings[n])]
