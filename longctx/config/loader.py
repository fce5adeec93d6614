"""The one config loader of every command: a typed dataclass schema (omegaconf structured
config), an optional YAML file, `key=value` overrides and already-typed values (command-line
flags), merged in that order.

Loading is strict: an unknown key is rejected with the closest valid key suggested (a dash
in a key may stand for an underscore), a value of the wrong type names its field, and a
missing required value names its field. Every failure is one UserError. A list of scalars
may be written as one comma-separated string (`lengths=4k,8k`).
"""
from __future__ import annotations

import difflib
import re
import typing
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from longctx.base.errors import UserError

Schema = TypeVar("Schema")
_CONVERSION = re.compile(r"Value '(?P<value>.*)' of type '\w+' could not be converted to (?P<kind>\w+)")
_KINDS = {"Integer": "an integer", "Float": "a number", "String": "a string"}
_BOOL = re.compile(r"Value '(?P<value>.*)' is not a valid bool")


def load_structured(schema: type[Schema], path: Optional[str] = None, overrides: Sequence[str] = (),
                    values: Optional[Mapping[str, Any]] = None, *, prefix: str = "") -> Schema:
    """schema defaults < YAML file < key=value overrides < `values` (nested mappings) -> a
    `schema` instance. `prefix` ("eval.") names the fields in messages; a file or override
    may also write it (`eval.samples=5`, or a file whose one top-level key is `eval`)."""
    layers = []
    if path is not None:
        user = OmegaConf.to_container(_load_file(path))
        section = prefix.rstrip(".")
        if section and list(user) == [section] and isinstance(user[section], dict):
            user = user[section]
        layers.append(_checked_keys(user, schema, prefix))
    for item in overrides:
        key, value = _parse_override(item)
        if prefix and key.startswith(prefix):
            key = key[len(prefix):]
        layers.append(_checked_keys(_nest(key, value), schema, prefix))
    if values:
        layers.append(_checked_keys(dict(values), schema, prefix))
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), *[OmegaConf.create(layer) for layer in layers])
        return OmegaConf.to_object(merged)
    except MissingMandatoryValue as e:
        raise UserError(f"{prefix}{e.full_key}: required (no default)") from None
    except OmegaConfBaseException as e:
        raise UserError(_typed_error(e, prefix)) from None


def to_yaml(obj: Any) -> str:
    """A schema instance as the YAML that load_structured reads back."""
    return OmegaConf.to_yaml(OmegaConf.structured(obj))


def _typed_error(e: OmegaConfBaseException, prefix: str) -> str:
    """omegaconf's message as `<field>: must be <kind>, got <value>` where it is a conversion."""
    key = getattr(e, "full_key", None) or ""
    msg = str(e).splitlines()[0]
    conversion, boolean = _CONVERSION.search(msg), _BOOL.search(msg)
    if conversion:
        msg = f"must be {_KINDS.get(conversion['kind'], conversion['kind'])}, got {conversion['value']!r}"
    elif boolean:
        msg = f"must be true or false, got {boolean['value']!r}"
    return f"{prefix}{key}: {msg}" if key else msg


def _dataclass_in(t: Any) -> Any:
    """The dataclass inside a field type (X, Optional[X], List[X]), or None."""
    if is_dataclass(t):
        return t
    for arg in typing.get_args(t):
        found = _dataclass_in(arg)
        if found is not None:
            return found
    return None


def _is_scalar_list(t: Any) -> bool:
    """Whether a field type is List[str | int | float] (or Optional of it)."""
    if typing.get_origin(t) is typing.Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        return len(args) == 1 and _is_scalar_list(args[0])
    return typing.get_origin(t) is list and typing.get_args(t)[0] in (str, int, float)


def _checked_keys(node: dict, schema: type, where: str) -> dict:
    """`node` with every key a field of `schema` (a dash accepted for an underscore) and a
    scalar given for a list of scalars read as a comma-separated list ("4k,8k"), recursively;
    an unknown key -> UserError with the closest valid key."""
    hints = typing.get_type_hints(schema)
    out = {}
    for key, value in node.items():
        key = str(key)
        if key not in hints and key.replace("-", "_") in hints:
            key = key.replace("-", "_")
        if key not in hints:
            close = difflib.get_close_matches(key, list(hints), n=1)
            hint = f"did you mean '{where}{close[0]}'?" if close else f"valid: {', '.join(hints)}"
            raise UserError(f"{where}{key}: unknown key; {hint}")
        if _is_scalar_list(hints[key]) and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [item.strip() for item in str(value).split(",") if item.strip()]
        sub = _dataclass_in(hints[key])
        if sub is not None and is_dataclass(hints[key]) and value is not None and not isinstance(value, dict):
            raise UserError(f"{where}{key}: must be a mapping of {where}{key}.* fields "
                            f"(e.g. {where}{key}.{next(iter(typing.get_type_hints(sub)))}=...), "
                            f"got {type(value).__name__} {value!r}")
        if sub is not None and isinstance(value, dict):
            value = _checked_keys(value, sub, f"{where}{key}.")
        elif sub is not None and isinstance(value, list):
            value = [_checked_keys(item, sub, f"{where}{key}[{i}].") if isinstance(item, dict) else item
                     for i, item in enumerate(value)]
        out[key] = value
    return out


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise UserError(f"override {item!r}: expected key=value (e.g. train.steps=100)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or not all(part.strip() for part in key.split(".")):
        raise UserError(f"override {item!r}: {key!r} is not a dotted key (e.g. train.steps=100)")
    return key, _parse_value(key, raw)


def _parse_value(key: str, raw: str) -> Any:
    """A YAML value as omegaconf's dotlist reads it; a syntax error names the key."""
    if raw == "":
        return ""
    try:
        return OmegaConf.to_container(OmegaConf.create(f"v: {raw}"))["v"]
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        raise UserError(f"{key}: cannot parse {raw!r} as a YAML value ({problem}); write mappings as "
                        "{a: 1, b: 2}, lists as [x, y], and quote strings with special characters") from None


def _nest(key: str, value: Any) -> dict:
    out: dict = {}
    cur = out
    parts = key.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def _load_file(path: str) -> DictConfig:
    """A YAML (or JSON) config file: it must exist, parse, and hold a non-empty mapping."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise UserError(f"--config: {path} {what} (expected a YAML file)")
    try:
        user = OmegaConf.load(p)
    except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError) as e:
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        raise UserError(f"{path}: invalid YAML ({problem})") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(user, DictConfig):
        raise UserError(f"{path}: expected a mapping at the top level (e.g. 'train: {{steps: 100}}'), "
                        f"got a {type(OmegaConf.to_container(user)).__name__}")
    if len(user) == 0:
        raise UserError(f"{path}: empty config file (expected a mapping, e.g. 'train: {{steps: 100}}'; "
                        "leave out --config for the built-in defaults)")
    return user
