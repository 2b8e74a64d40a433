"""One policy for every YAML construct a config file can hold, tested by family: every kind of YAML node
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

from pipeline.config import ConfigError, PipelineConfig, _PlainLoader, load_config
from reder import configio

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


# The nodes whose meaning is of a field's type but out of its range, per field: the field's own check refuses each
# (the message matches the pattern). Every other node whose meaning is of the field's type must load.
OUT_OF_RANGE: dict[str, tuple[str, set[str]]] = {
    "workdir": ("must not be empty", {"quoted empty"}),
    "data.limit": ("must be >= 0", {"plain '-7'"}),
    "data.max_length_ratio": ("must be >= 1", {"plain '-7'", "plain '0'", "plain '1e-3'", "plain '-.5'"}),
    "loss.fba_start_step": ("must be an int >= 0 or null", {"plain '-7'"}),
    "loss.directions": ("must be one or both of", {"flow sequence of words", "empty sequence"}),
    "teacher.model.vocab_size": (r"must be > 4|must equal model\.vocab_size", {
        "plain '3'", "plain '-7'", "plain '0'", "plain '0x1F'", "plain '0o17'", "plain '1_000'"}),
    "teacher.model.dropout": (r"must be in \[0, 1\)", {
        "plain '3'", "plain '-7'", "plain '0x1F'", "plain '0o17'", "plain '1_000'", "plain '2.5'", "plain '-.5'",
        "plain '6.'"}),
    "teacher.train.adam_betas": (r"must be two values in \[0, 1\)", {"flow sequence", "empty sequence",
                                                                        "block sequence"}),
    "evaluate.test_sets": ("expected {src: FILE, tgt: FILE}", {"flow mapping", "block mapping"}),
    "loss.nmla_start_fraction": ("must be a fraction from 0 up to", {
        "plain '3'", "plain '-7'", "plain '0x1F'", "plain '0o17'", "plain '1_000'", "plain '2.5'", "plain '-.5'",
        "plain '6.'"}),
}


def _check_family(tmp_path: Path, kind: str) -> None:
    """Each node in the field of `kind` either loads to the value the policy gives it or is refused, as stated:
    it must load where its meaning is of the field's type and in the field's range (OUT_OF_RANGE)."""
    key, hint = KINDS[kind]
    default = _default(key)
    pattern, out_of_range = OUT_OF_RANGE.get(key, ("", set()))
    names = {name for name, _, _ in NODES}
    assert out_of_range <= names, out_of_range - names
    written = yaml.safe_dump(list(default) if isinstance(default, tuple) else default, default_flow_style=True)
    for name, node, meaning in [*NODES, ("its default", written.strip().removesuffix("\n..."), default)]:
        of_type = meaning is not REFUSED and _conforms(hint, _as_field(hint, meaning))
        assert of_type or name not in out_of_range, f"{name} is not of {key}'s type: no range check refuses it"
        path, line = _write(tmp_path, key, node)
        try:
            cfg = load_config(path)
        except ConfigError as error:
            message = str(error)
            assert not of_type or name in out_of_range, f"{key}: {name} ({node!r}) must load, but: {message}"
            at = re.match(rf"^{re.escape(str(path))}:(\d+): ", message)
            assert at and line <= int(at[1]) <= line + 2, (name, message)
            assert key in message, (name, message)
            assert name not in out_of_range or re.search(pattern, message), (name, message)
            continue
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        assert of_type and name not in out_of_range, f"{key}: {name} ({node!r}) must be refused, loaded {value!r}"
        assert _conforms(hint, value) and value == _as_field(hint, meaning), (name, node, value)


@pytest.mark.parametrize("kind", KINDS)
def test_every_node_in_every_field_loads_as_meant_or_names_file_line_and_key(tmp_path, kind):
    """A node loads exactly when its meaning is of the field's type and in the field's range, to that value; any
    other is refused: the message starts with the file and the line of the key (or, in a block sequence, of the
    item), names the key by its whole path and, out of range, says the field's check."""
    _check_family(tmp_path, kind)


def _resolving(tag: str, regexp: str) -> dict:
    """_PlainLoader's implicit resolvers with `tag` matched by `regexp` instead: a loader that reads otherwise."""
    resolvers = {first: [(t, pattern) for t, pattern in entries if t != tag]
                 for first, entries in _PlainLoader.yaml_implicit_resolvers.items()}
    for first in "-+0123456789tTfFyYnNoO":
        resolvers.setdefault(first, []).append((tag, re.compile(regexp)))
    return resolvers


def _refusing_ints(convert: Any, key: str) -> Any:
    """`configio._convert` refusing every int in field `key` (its items too), naming the key as it would."""
    def refuse(hint: Any, value: Any, path: str) -> Any:
        if hint is int and type(value) is int and re.sub(r"\[\d+\]$", "", path) == key:
            raise ConfigError(f"{path}: expected int, got int {value!r}")
        return convert(hint, value, path)
    return refuse


def _taking_bools_as_ints(convert: Any) -> Any:
    """`configio._convert` taking a bool where an int is asked."""
    def take(hint: Any, value: Any, path: str) -> Any:
        return value if hint is int and type(value) is bool else convert(hint, value, path)
    return take


@pytest.mark.parametrize("kind, broken", [
    ("typing.Optional[int]", "refuses the field's ints"), ("tuple[int, ...]", "refuses the field's ints"),
    ("<class 'int'>", "reads 0x1F and 0o17 as strings"), ("<class 'bool'>", "reads yes, no, on, off as strings"),
    ("<class 'int'>", "takes true as an int"),
])
def test_the_family_fails_a_loader_that_refuses_a_valid_node_or_takes_an_invalid_one(tmp_path, monkeypatch, kind,
                                                                                      broken):
    """A loader that refuses a node of the field's type and range (each with a message naming file, line and key,
    and the field's default still loading), or loads a node of another type, fails the family."""
    if broken == "refuses the field's ints":
        monkeypatch.setattr(configio, "_convert", _refusing_ints(configio._convert, KINDS[kind][0]))
    elif broken == "takes true as an int":
        monkeypatch.setattr(configio, "_convert", _taking_bools_as_ints(configio._convert))
    elif broken.startswith("reads 0x1F"):
        monkeypatch.setattr(_PlainLoader, "yaml_implicit_resolvers", _resolving(
            "tag:yaml.org,2002:int", r"^[-+]?(?:0|[1-9][0-9_]*)$"))
    else:
        monkeypatch.setattr(_PlainLoader, "yaml_implicit_resolvers", _resolving(
            "tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$"))
    with pytest.raises(AssertionError, match="must load|must be refused"):
        _check_family(tmp_path, kind)


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
