"""A subcommand's settings from its flags, ``GEM_*`` environment variables and a TOML file, in that precedence
(then the flags' defaults and the preset).

Every flag ``--max-body-mb`` is also ``GEM_MAX_BODY_MB`` and the file key ``max_body_mb`` (or ``max-body-mb``);
every `GEMConfig` field ``k`` is ``GEM_K`` and the key ``k`` of the file's ``[compression]`` table (evidence
limits: ``GEM_EVIDENCE_RECENT``, ``[compression.evidence]``), applied like ``--set k=...`` (a ``--set`` on the
command line wins). An unknown file key is an error that names it and the keys there are; a ``GEM_*`` variable
that names nothing is left alone (other tools share the prefix).
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gemkernels.compress.config import EvidenceConfig, GEMConfig

ENV_PREFIX = "GEM_"
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SettingsError(ValueError):
    """A setting that cannot be used; the message names it and where it came from."""


@dataclass(frozen=True)
class Deferred:
    """A parser's flags whose defaults are applied after the environment and the file: dest -> (action, default)."""

    flags: dict[str, tuple[argparse.Action, Any]]
    required: tuple[str, ...]


def defer_defaults(parser: argparse.ArgumentParser, keep: Sequence[str] = ("help", "config", "set")) -> Deferred:
    """Make every flag of ``parser`` but ``keep`` default to None (so a given flag is told from an absent one),
    remembering its default for `resolve`; help texts keep showing the real defaults."""
    flags, required = {}, []
    for action in parser._actions:
        if action.dest in keep or not action.option_strings:
            continue
        flags[action.dest] = (action, action.default)
        if action.help and "%(default)s" in action.help:
            action.help = action.help.replace("%(default)s", str(action.default))
        if action.required:
            action.required = False
            required.append(action.dest)
        action.default = None
    return Deferred(flags, tuple(required))


def resolve(args: argparse.Namespace, deferred: Deferred, command: str,
            environ: Mapping[str, str] = os.environ) -> argparse.Namespace:
    """``args`` with each absent flag taken from ``GEM_<FLAG>``, else the file (``args.config``), else its
    default; ``args.set`` becomes the file's and the environment's `GEMConfig` fields, then the command line's."""
    table: dict[str, Any] = {}
    compression: list[str] = []
    if getattr(args, "config", None):
        table, compression = read_file(Path(args.config), deferred, command)
    out = argparse.Namespace(**vars(args))
    for dest, (action, default) in deferred.flags.items():
        if getattr(args, dest) is not None:
            continue
        variable = ENV_PREFIX + dest.upper()
        if variable in environ:
            value = converted(action, environ[variable], f"${variable}")
        elif dest in table:
            value = converted(action, table[dest], f"{args.config}: {dest}")
        else:
            value = default
        setattr(out, dest, value)
    missing = [dest for dest in deferred.required if getattr(out, dest) is None]
    if missing:
        dest = missing[0]
        raise SettingsError(f"--{dest.replace('_', '-')} is required (or {ENV_PREFIX}{dest.upper()}, or {dest} in "
                            "the --config file)")
    from_environment = environment_overrides(environ)
    out.set = compression + [item for item, _ in from_environment] + list(args.set or [])
    out.set_sources = {**{item: f"{args.config} [compression]" for item in compression},
                       **{item: f"${variable}" for item, variable in from_environment}}
    return out


def read_file(path: Path, deferred: Deferred, command: str) -> tuple[dict[str, Any], list[str]]:
    """The file's flags (dest -> value) and its ``[compression]`` table as ``field=value`` overrides."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise SettingsError(f"cannot read the config file {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"{path} is not valid TOML: {err}") from None
    table = {key.replace("-", "_"): value for key, value in data.items() if key != "compression"}
    for key in table:
        if key not in deferred.flags:
            raise SettingsError(unknown(path, key, sorted(deferred.flags) + ["compression"], command))
    compression = data.get("compression", {})
    if not isinstance(compression, dict):
        raise SettingsError(f"{path}: compression must be a table of GEMConfig fields")
    return table, file_overrides(path, compression, command)


def file_overrides(path: Path, compression: dict[str, Any], command: str) -> list[str]:
    """``[compression]`` (and ``[compression.evidence]``) as ``field=value`` override items."""
    names = [f.name for f in fields(GEMConfig) if f.name != "evidence"]
    evidence_names = [f.name for f in fields(EvidenceConfig)]
    items = []
    for key, value in compression.items():
        if key == "evidence" and isinstance(value, dict):
            for name, limit in value.items():
                if name not in evidence_names:
                    raise SettingsError(unknown(path, f"compression.evidence.{name}", evidence_names, command))
                items.append(f"evidence.{name}={override_text(limit)}")
        elif key in names:
            items.append(f"{key}={override_text(value)}")
        else:
            raise SettingsError(unknown(path, f"compression.{key}", names + ["evidence"], command))
    return items


def environment_overrides(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """``GEM_<FIELD>`` and ``GEM_EVIDENCE_<FIELD>`` variables as (``field=value`` override item, variable)."""
    names = [(f.name, ENV_PREFIX + f.name.upper()) for f in fields(GEMConfig) if f.name != "evidence"]
    names += [(f"evidence.{f.name}", f"{ENV_PREFIX}EVIDENCE_{f.name.upper()}") for f in fields(EvidenceConfig)]
    return [(f"{name}={environ[variable]}", variable) for name, variable in names if variable in environ]


def override_text(value: Any) -> str:
    """A TOML value as the text of a ``field=value`` override (strings as they are, the rest as literals)."""
    if isinstance(value, list):
        value = tuple(value)
    return value if isinstance(value, str) else repr(value)


def converted(action: argparse.Action, value: Any, where: str) -> Any:
    """``value`` (a string from the environment, or a TOML value) as the flag ``action`` would have stored it."""
    if action.nargs == 0:  # store_true / store_false
        if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
            value = value.strip().lower() in TRUE
        if not isinstance(value, bool):
            raise SettingsError(f"{where}: {value!r} is not true or false")
        return value
    try:
        out = action.type(value if isinstance(value, str) else str(value)) if action.type else value
    except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
        raise SettingsError(f"{where}: {value!r} is not a valid {action.dest} ({err})") from None
    if action.choices is not None and out not in action.choices:
        raise SettingsError(f"{where}: {out!r} is not one of {', '.join(map(str, action.choices))}")
    return out


def unknown(path: Path, key: str, known: Sequence[str], command: str) -> str:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{path}: unknown key {key!r}{hint}; gem {command} knows {', '.join(known)}"
