"""The one config loader: nested dicts <-> frozen config dataclasses, for reder/ and pipeline/ alike.

`from_dict` checks every key and type and names the key's path in its errors
(`data.max_chars: expected int, got str 'many'`); `to_dict` gives plain dicts and lists (JSON/YAML-ready)
that `from_dict` loads back. Pure Python: pipeline/config.py adds the YAML reading and overrides.

Loading is lenient exactly where saved files need it: an int is accepted (and converted) where a float
is expected (older model directories hold e.g. `graph_upsample_ratio: 8`), a list where a tuple is
(JSON and YAML have no tuples). Nothing else is converted: "3" is not an int, 1 is not a bool. A float
must be finite: no field means anything by inf or nan (YAML's `.inf`, `.nan`), so they are errors at load.
"""
from __future__ import annotations

import dataclasses
import math
import operator
import re
import types
import typing
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad key, value or type in a config; the message names the key's path (`key`, where it is not the path the
    message starts with: the first unknown key)."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class FieldError(ValueError):
    """A `__post_init__` check that failed on field `key` (`problem` ends with `got <value>`). Other fields
    the problem names are listed in `related`; `from_dict` names them all by their whole path."""

    def __init__(self, key: str, problem: str, related: tuple[str, ...] = ()) -> None:
        super().__init__(f"{key}: {problem}")
        self.key, self.problem, self.related = key, problem, related

    def at(self, path: str) -> str:
        """The message with the field and its related fields under `path` (`model.n_heads: ... model.d_model`)."""
        problem = self.problem
        for name in self.related:
            problem = re.sub(rf"(?<![\w.]){re.escape(name)}\b", _join(path, name), problem)
        return f"{_join(path, self.key)}: {problem}"


_COMPARISONS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def require(config: Any, **rules: str) -> None:
    """Check fields against bounds and raise FieldError for the first field out of range. A rule compares
    with a number (`lr="> 0"`, `workers=">= 0"`, also `<` and `<=`) or names an interval, `[`/`]` closed and
    `(`/`)` open (`dropout="in [0, 1)"`); `from_dict` reports e.g. `train.lr: must be > 0, got 0.0`."""
    for name, rule in rules.items():
        value = getattr(config, name)
        if not _within(value, rule):
            raise FieldError(name, f"must be {rule}, got {value!r}")


def _within(value: Any, rule: str) -> bool:
    if rule.startswith("in "):
        low, high = (float(bound) for bound in rule[4:-1].split(","))
        above = value >= low if rule[3] == "[" else value > low
        return above and (value <= high if rule[-1] == "]" else value < high)
    comparison, bound = rule.split()
    return _COMPARISONS[comparison](value, float(bound))


def from_dict(cls: type[T], values: Any, path: str = "") -> T:
    """Build dataclass `cls` from a nested dict, checking every key and type (`path` prefixes messages)."""
    where = path or cls.__name__
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping for {cls.__name__}, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known, key=str)
    if unknown:
        paths = [_join(path, key) for key in unknown]
        raise ConfigError(f"{where}: unknown keys {paths}; known keys are {sorted(known)}", paths[0])
    kwargs = {key: _convert(hints[key], value, _join(path, key)) for key, value in values.items()}
    try:
        return cls(**kwargs)
    except FieldError as error:
        raise ConfigError(error.at(path)) from error
    except (TypeError, ValueError) as error:  # a check that names no field (config classes raise FieldError)
        raise ConfigError(f"{path}: {error}" if path else str(error)) from error


def to_dict(config: Any) -> dict[str, Any]:
    """A config dataclass as plain nested dicts and lists (tuples become lists), loadable by `from_dict`."""
    return _plain(dataclasses.asdict(config))


def round_trip(cls: type[T]) -> type[T]:
    """Give a config dataclass the methods `to_dict()` and classmethod `from_dict(values, path="")`, both
    this module's (checkpoints, model directories and Ray workers call them on the class)."""
    cls.to_dict = to_dict  # type: ignore[attr-defined]
    cls.from_dict = classmethod(from_dict)  # type: ignore[attr-defined]
    return cls


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


def _convert(hint: Any, value: Any, path: str) -> Any:
    """Check `value` against type `hint`; nested dataclasses are built recursively."""
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, path)
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices or type(value) is not type(choices[0]):
            raise ConfigError(f"{path}: expected one of {list(choices)}, got {value!r}{_unquoted(value)}")
        return value
    if origin in (Union, types.UnionType):
        errors = []
        for option in typing.get_args(hint):
            if option is type(None):
                if value is None:
                    return None
                continue
            try:
                return _convert(option, value, path)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(f"{path}: {value!r} matches none of {hint}: {errors}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__} {value!r}")
        (item_type, _ellipsis) = typing.get_args(hint)
        return tuple(_convert(item_type, item, f"{path}[{i}]") for i, item in enumerate(value))
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected float, got {type(value).__name__} {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an int beyond float's range
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"{path}: expected a finite number, got {value!r}")
        return number
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected int, got {type(value).__name__} {value!r}")
        return value
    if hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__} {value!r}")
        return dict(value)
    if hint in (str, bool):
        if not isinstance(value, hint):
            hint_text = _unquoted(value) if hint is str else ""
            raise ConfigError(f"{path}: expected {hint.__name__}, got {type(value).__name__} {value!r}{hint_text}")
        return value
    raise ConfigError(f"{path}: unsupported field type {hint}")


def _unquoted(value: Any) -> str:
    """Why a value that is no string was likely meant as one: YAML reads bare yes/no/on/off/true/false as booleans,
    numbers and dates as such, and an empty value as null."""
    if value is None:
        return " (an empty value is null: write one, or leave the key out for its default)"
    if isinstance(value, (bool, int, float)) or type(value).__name__ in ("date", "datetime"):
        return " (YAML reads a bare yes, no, on, off, true, false, number or date as no string: put it in quotes)"
    return ""
