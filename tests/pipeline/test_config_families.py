"""Issue 55: one policy for every YAML construct a config file can hold, tested by family: every kind of YAML node
(each implicit scalar type PyYAML's resolver table knows, each scalar style, sequences, mappings, anchors, aliases,
tags, merge keys, nulls) in every kind of config field (each field type of the config dataclasses). Each either
loads to the value the policy gives it, of the field's type, or is a ConfigError naming the file, the line and the
key (docs/USAGE.md, "Bad input")."""
from __future__ import annotations

import dataclasses
import datetime
import math
import re
import typing
from pathlib import Path
from typing import Any, Literal, Union

import pytest
import yaml

from pipeline.config import ConfigError, PipelineConfig, load_config

REFUSED = object()  # a construct the loader refuses whatever the field


def _fields(cls: type = PipelineConfig, prefix: str = "") -> list[tuple[str, Any]]:
    """Every leaf field of the config, by dotted path, with its type."""
    found = []
    for name, hint in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            found += _fields(hint, f"{prefix}{name}.")
        else:
            found.append((f"{prefix}{name}", hint))
    return found


def _kind(hint: Any) -> str:
    origin = typing.get_origin(hint)
    return "Literal" if origin is Literal else str(hint)


FIELDS = _fields()
KINDS: dict[str, tuple[str, Any]] = {}  # one field per kind of field type: the first in the config's order, and
for path, hint in FIELDS:  # one nested two sections deep where there is one (their YAML sits at another depth)
    KINDS.setdefault(_kind(hint), (path, hint))
    if path.count(".") == 2:
        KINDS.setdefault(f"{_kind(hint)} (nested)", (path, hint))


def test_the_kinds_cover_every_field_type_the_config_has():
    assert {_kind(hint) for _, hint in FIELDS} == {kind for kind in KINDS if "(nested)" not in kind}
    assert len(KINDS) >= 10


# The family of YAML nodes: (name, text written after `key: `, what it means by the policy). Scalars: one example
# or more of every tag PyYAML's implicit resolver knows (asserted below, so a new one is not missed), in YAML 1.1's
# spellings and the ones this loader reads otherwise; then every scalar style and every collection and construct.
SCALARS = [
    ("tag:yaml.org,2002:bool", "true", True), ("tag:yaml.org,2002:bool", "False", False),
    ("tag:yaml.org,2002:bool", "yes", True), ("tag:yaml.org,2002:bool", "no", False),
    ("tag:yaml.org,2002:bool", "on", True), ("tag:yaml.org,2002:bool", "OFF", False),
    ("tag:yaml.org,2002:int", "3", 3), ("tag:yaml.org,2002:int", "-7", -7), ("tag:yaml.org,2002:int", "0", 0),
    ("tag:yaml.org,2002:int", "0x1F", 31), ("tag:yaml.org,2002:int", "0o17", 15), ("tag:yaml.org,2002:int", "1_000", 1000),
    ("tag:yaml.org,2002:int", "010", "010"),  # YAML 1.1: octal 8; here a string, which no number field takes
    ("tag:yaml.org,2002:int", "1:20", "1:20"),  # YAML 1.1: sexagesimal 80; here a string
    ("tag:yaml.org,2002:int", "0b101", "0b101"),  # YAML 1.1: binary 5; here a string
    ("tag:yaml.org,2002:float", "2.5", 2.5), ("tag:yaml.org,2002:float", "1e-3", 0.001),  # YAML 1.1: "1e-3" a string
    ("tag:yaml.org,2002:float", "-.5", -0.5), ("tag:yaml.org,2002:float", "6.", 6.0),
    ("tag:yaml.org,2002:float", ".inf", math.inf), ("tag:yaml.org,2002:float", "-.inf", -math.inf),
    ("tag:yaml.org,2002:float", ".nan", math.nan), ("tag:yaml.org,2002:float", "1:20.5", "1:20.5"),
    ("tag:yaml.org,2002:null", "", None), ("tag:yaml.org,2002:null", "~", None), ("tag:yaml.org,2002:null", "null", None),
    ("tag:yaml.org,2002:timestamp", "2001-12-14", datetime.date(2001, 12, 14)),
    ("tag:yaml.org,2002:timestamp", "2001-12-14 21:59:43.10", datetime.datetime(2001, 12, 14, 21, 59, 43, 100000)),
    ("tag:yaml.org,2002:merge", "<<", "<<"),  # a merge key's spelling as a value is a string
    ("tag:yaml.org,2002:value", "=", "="),
    ("tag:yaml.org,2002:str", "bpe", "bpe"), ("tag:yaml.org,2002:str", "two words", "two words"),
]
NODES = [(f"plain {text!r}", text, meaning) for _, text, meaning in SCALARS] + [
    ("single-quoted number", "'3'", "3"), ("double-quoted yes", '"yes"', "yes"), ("quoted empty", "''", ""),
    ("double-quoted escape", '"a\\tb"', "a\tb"),
    ("literal block", "|\n    first\n    second", "first\nsecond\n"), ("folded block", ">-\n    one\n    two", "one two"),
    ("flow sequence", "[1, 2]", [1, 2]), ("flow sequence of floats", "[0.9, 0.98]", [0.9, 0.98]),
    ("flow sequence of words", "[test, valid]", ["test", "valid"]), ("empty sequence", "[]", []),
    ("block sequence", "\n    - 1\n    - 2", [1, 2]), ("nested sequence", "[[1], [2]]", [[1], [2]]),
    ("flow mapping", "{a: 1}", {"a": 1}), ("empty mapping", "{}", {}), ("block mapping", "\n    a: 1", {"a": 1}),
    ("anchor", "&x 3", REFUSED), ("anchored sequence", "&x [1]", REFUSED), ("alias", "*x", REFUSED),
    ("str tag", "!!str 3", REFUSED), ("int tag", "!!int '3'", REFUSED), ("python object tag", "!!python/object:os.system {}", REFUSED),
    ("local tag", "!custom x", REFUSED), ("binary tag", "!!binary aGVsbG8=", REFUSED),
    ("merge key", "{<<: {a: 1}}", REFUSED), ("set", "!!set {a: null}", REFUSED),
]


def test_the_scalars_cover_every_tag_the_resolver_knows():
    """A tag PyYAML's resolver table gains (a new implicit type) must get an example here."""
    known = {tag for resolvers in yaml.SafeLoader.yaml_implicit_resolvers.values() for tag, _ in resolvers}
    assert known - {"tag:yaml.org,2002:yaml"} <= {tag for tag, _, _ in SCALARS}  # !!yaml: a YAML 1.1 relic, "!"


def _conforms(hint: Any, value: Any) -> bool:
    """Whether `value` is of the field type `hint` exactly (no bool for int, a finite float for float)."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return isinstance(value, str) and value in typing.get_args(hint)
    if origin is Union:
        return any(_conforms(option, value) for option in typing.get_args(hint))
    if origin is tuple:
        return isinstance(value, tuple) and all(_conforms(typing.get_args(hint)[0], item) for item in value)
    if hint is float:
        return type(value) is float and math.isfinite(value)
    if hint is type(None):
        return value is None
    return type(value) is hint


def _as_field(hint: Any, meaning: Any) -> Any:
    """What a loaded field holds for `meaning`: a list as a tuple, an int as a float where a float is asked."""
    origin = typing.get_origin(hint)
    if origin is tuple and isinstance(meaning, list):
        return tuple(_as_field(typing.get_args(hint)[0], item) for item in meaning)
    if hint is float and type(meaning) is int:
        return float(meaning)
    if origin is Union and type(meaning) is int and float in typing.get_args(hint):
        return float(meaning)
    return meaning


def _write(tmp_path: Path, key: str, node: str) -> tuple[Path, int]:
    """A config file setting `key` (dotted) to the YAML `node`; returns it and the line of the key's last part.
    An alias gets its anchor on an earlier key, which is refused first (so the alias is refused on its own line
    only where the anchor was not: the message names the anchor's line then)."""
    *sections, name = key.split(".")
    lines = [f"{'  ' * depth}{section}:" for depth, section in enumerate(sections)]
    indent = "  " * len(sections)
    lines.append(f"{indent}{name}: {node.replace(chr(10) + '    ', chr(10) + indent + '  ')}")
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, len(sections) + 1


def _default(key: str) -> Any:
    value: Any = PipelineConfig()
    for part in key.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("kind", KINDS)
def test_every_node_in_every_field_loads_as_meant_or_names_file_line_and_key(tmp_path, kind):
    """Loaded: the value the policy gives the node, of the field's type (a node whose meaning is not of the field's
    type never loads). Refused: the message starts with the file and the line of the key (or, in a block
    sequence, of the item) and names the key by its whole path."""
    key, hint = KINDS[kind]
    default = _default(key)
    written = yaml.safe_dump(list(default) if isinstance(default, tuple) else default, default_flow_style=True)
    loaded = 0
    for name, node, meaning in [*NODES, ("its default", written.strip().removesuffix("\n..."), default)]:
        path, line = _write(tmp_path, key, node)
        try:
            cfg = load_config(path)
        except ConfigError as error:
            message = str(error)
            at = re.match(rf"^{re.escape(str(path))}:(\d+): ", message)
            assert at and line <= int(at[1]) <= line + 2, (name, message)
            assert key in message, (name, message)
            continue
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        assert meaning is not REFUSED, (name, value)
        assert _conforms(hint, value) and value == _as_field(hint, meaning), (name, node, value)
        loaded += 1
    assert loaded, f"no node loads into {key}: the family tests nothing but errors there"


@pytest.mark.parametrize("kind", KINDS)
def test_a_key_given_twice_in_any_field_names_the_key_and_both_lines(tmp_path, kind):
    key, _ = KINDS[kind]
    path, line = _write(tmp_path, key, "x")
    text = path.read_text(encoding="utf-8")
    last = text.splitlines()[-1]
    path.write_text(text + last + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:{line + 1}: key '{re.escape(key)}' given twice "
                                          rf"\(lines {line} and {line + 1}\)"):
        load_config(path)


@pytest.mark.parametrize("name, node, meaning", NODES, ids=[name for name, _, _ in NODES])
def test_every_node_as_the_whole_file_is_the_defaults_or_an_error_naming_the_file_and_line(tmp_path, name, node, meaning):
    """The top level must be a mapping of sections: null (an empty file) is the defaults, an empty mapping too;
    anything else names the file and line 1."""
    path = tmp_path / "config.yaml"
    path.write_text(node.strip() + "\n", encoding="utf-8")
    if meaning is None or meaning == {}:
        assert load_config(path).data == load_config(None).data
        return
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value).startswith(f"{path}:1") and ("top level" in str(error.value) or "not plain data" in
                                                         str(error.value) or "unknown keys" in str(error.value))


@pytest.mark.parametrize("text, message", [
    ("", None), ("# only a comment\n", None), ("---\n", None),
    ("workdir: a\n---\nworkdir: b\n", r":2:1: invalid YAML \(expected a single document in the stream but found "
                                        r"another document\)"),
    ("train:\n  lr: [1, 2\n", r":3:1: invalid YAML"),
    ("data:\n", None), ("data: {}\n", None),
    ("? [a, b]\n: 1\n", r":1: a key that is a list, in 'the top level'"),
    ("data:\n  ? {a: 1}\n  : 1\n", r":2: a key that is a mapping, in 'data'"),
])
def test_documents_empty_files_and_empty_sections(tmp_path, text, message):
    """An empty file, a comment, an empty document or section: the defaults. Two documents, broken syntax and a
    key that is a list: errors naming file, line and column."""
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    if message is None:
        assert load_config(path).data == load_config(None).data
    else:
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}{message}"):
            load_config(path)
