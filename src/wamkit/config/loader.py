"""TOML recipe + dotted `--set` overrides -> a validated ExperimentConfig.

Unknown keys are errors with the nearest valid key suggested: a silently ignored knob costs users
hours, so nothing is ever dropped on the floor."""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
import typing
from pathlib import Path
from typing import Any

from wamkit.config.schema import ExperimentConfig
from wamkit.errors import ConfigError


def load_experiment(recipe: str | Path | None, overrides: list[str] = ()) -> ExperimentConfig:
    """Read a recipe file, apply `a.b=c` overrides in order, validate."""
    raw: dict[str, Any] = {}
    source = "<defaults>"
    if recipe is not None:
        source = str(recipe)
        raw = read_recipe(Path(recipe))
    if "distill" in raw:
        raise ConfigError(source, "is a distillation recipe (it has a [distill] section)", f"run it with `wamkit distill {source}`")
    config = ExperimentConfig()
    _merge(config, raw, prefix="", source=source)
    for item in overrides:  # merged one by one, so a bad value names the --set that gave it, not the recipe
        override: dict[str, Any] = {}
        _apply_override(override, item)
        _merge(config, override, prefix="", source=f"--set {item}")
    return config.validate()


def read_recipe(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A recipe's raw table. `extends = "other.toml"` (relative to this file) loads that recipe
    first and overlays this one, so a tiny variant states only what differs from the full recipe."""
    if not path.is_file():
        raise ConfigError(str(path), "recipe file not found", "pass a path to a .toml recipe, e.g. recipes/demo_tiny.toml")
    if path.resolve() in seen:
        raise ConfigError(str(path), "extends itself through a cycle", "remove the circular `extends`")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"invalid TOML: {exc}", "fix the syntax at the reported line") from exc
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends", "must be a path string", 'e.g. extends = "../g1_simple.toml"')
    return _overlay(read_recipe(path.parent / parent, seen + (path.resolve(),)), raw)


def _overlay(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _overlay(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def config_from_dict(data: dict, source: str = "resolved config") -> ExperimentConfig:
    """An ExperimentConfig from `config_to_dict` output (e.g. a run's resolved_config.json), with the
    same strictness as a recipe: an unknown key means another wamkit version wrote it."""
    config = ExperimentConfig()
    _merge(config, data, prefix="", source=source)
    return config.validate()


def _apply_override(raw: dict, item: str) -> None:
    if "=" not in item:
        raise ConfigError(f"--set {item}", "expected KEY=VALUE", "e.g. --set trainer.max_iter=100")
    key, text = item.split("=", 1)
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}", f"{part!r} is a value, not a section",
                              f"set the value itself, e.g. --set {'.'.join(parts[:parts.index(part) + 1])}=...")
    node[parts[-1]] = _parse_value(text.strip())


def _parse_value(text: str) -> Any:
    """TOML literal if it parses (numbers, bools, lists, quoted strings), else a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _merge(obj: Any, raw: dict, prefix: str, source: str) -> None:
    hints = typing.get_type_hints(type(obj))
    fields = {f.name: f for f in dataclasses.fields(obj)}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            raise ConfigError(f"{source}: {dotted}", "unknown key", _suggest(prefix, key, list(fields)))
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {dotted}", "is a section; got a value", f"use [{dotted}] with keys")
            _merge(current, value, prefix=f"{dotted}.", source=source)
        else:
            setattr(obj, key, _coerce(value, hints[key], f"{source}: {dotted}"))


def _suggest(prefix: str, key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if close:
        return f"did you mean {prefix}{close[0]}?"
    return f"valid keys here: {', '.join(prefix + v for v in valid)}"


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is list:
        if not isinstance(value, list):
            value = [value]
        (inner,) = typing.get_args(hint)
        return [_coerce(v, inner, where) for v in value]
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(where, f"expected true/false, got {value!r}", "write true or false (lowercase, unquoted)")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(where, f"expected an integer, got {value!r}", "write a whole number without quotes or a decimal point, e.g. 100")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(where, f"expected a number, got {value!r}", "write a number without quotes, e.g. 1e-4")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(where, f"expected a string, got {value!r}", f'quote it: "{value}" (on the command line: --set {where.rsplit(": ", 1)[-1]}=\'"{value}"\')')
    return value


def config_to_dict(config: ExperimentConfig) -> dict:
    return dataclasses.asdict(config)


def format_config(config: ExperimentConfig) -> str:
    """TOML-like listing of every resolved knob, for --dry-run and the run directory."""
    lines = []
    for section, values in config_to_dict(config).items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {json.dumps(v)}" for k, v in values.items())
        lines.append("")
    return "\n".join(lines)
