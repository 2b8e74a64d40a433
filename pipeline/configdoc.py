"""The config reference, docs/CONFIG.md, generated from the config dataclasses (their defaults, types,
docstrings and the comments beside each field), so that it cannot drift from the code:

    python -m pipeline.configdoc > docs/CONFIG.md

tests/pipeline/test_config.py checks that the committed file equals this output.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing
from typing import Any

from pipeline.config import PipelineConfig

HEADER = """# Config reference

Every key of a run's config, generated from the dataclasses that define it (`python -m pipeline.configdoc >
docs/CONFIG.md`; a test checks that this file is that output). A YAML file in `configs/` sets some of them,
`key=value` on the command line overrides any (`train.max_steps=100`, `loss.lambda_fba=0.1`); unknown keys
and wrong types are errors naming the key. How the stages use them: [USAGE.md](USAGE.md).
"""


def field_notes(cls: type) -> dict[str, str]:
    """The comment lines above each field of dataclass `cls` (and of the classes it extends) and the comment at
    the end of its line."""
    notes: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        pending: list[str] = []
        for line in inspect.getsource(klass).splitlines():
            stripped = line.strip()
            if stripped.startswith("#"):
                pending.append(stripped.lstrip("#").strip())
                continue
            match = re.match(r"    (\w+): [^#]*?(?:#\s*(.*))?$", line)
            if match:
                notes[match.group(1)] = " ".join(pending + ([match.group(2)] if match.group(2) else []))
            pending = []
    return notes


def _type_name(kind: Any) -> str:
    if typing.get_origin(kind) is typing.Literal:
        return " \\| ".join(f'`"{v}"`' if isinstance(v, str) else f"`{v!r}`" for v in typing.get_args(kind))
    text = getattr(kind, "__name__", None) if typing.get_origin(kind) is None else str(kind)
    return (text or str(kind)).replace("typing.", "").replace("|", "\\|")


def _default(spec: dataclasses.Field) -> str:
    if spec.default is not dataclasses.MISSING:
        value = spec.default
    elif spec.default_factory is not dataclasses.MISSING:
        value = spec.default_factory()
    else:
        return "(required)"
    return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"


def _table(path: str, cls: type) -> tuple[list[str], list[tuple[str, type]]]:
    """A section's table of keys (`path.key`), and its nested sections."""
    hints, notes = typing.get_type_hints(cls), field_notes(cls)
    lines, nested = ["| key | type | default | what |", "|---|---|---|---|"], []
    for spec in dataclasses.fields(cls):
        kind = hints[spec.name]
        if dataclasses.is_dataclass(kind):
            nested.append((f"{path}.{spec.name}" if path else spec.name, kind))
            continue
        key = f"{path}.{spec.name}" if path else spec.name
        lines.append(f"| `{key}` | {_type_name(kind)} | {_default(spec)} | {notes.get(spec.name, '').replace('|', chr(92) + '|')} |")
    return lines + [""], nested


def _flatten(values: dict[str, Any], path: str = "") -> dict[str, Any]:
    """Each section's default values by its path ("teacher.train": {...})."""
    out = {path: values}
    for key, value in values.items():
        if isinstance(value, dict) and key != "space":
            out.update(_flatten(value, f"{path}.{key}" if path else key))
    return out


def anchor(path: str, cls: type) -> str:
    """GitHub's anchor of a section heading `` `path` (Class) ``."""
    return re.sub(r"[^\w\- ]", "", f"{path} ({cls.__name__})".lower()).replace(" ", "-")


def reference() -> str:
    """docs/CONFIG.md's text: the top-level keys, then each section, sections before the ones nested in them
    (a class met again is a pointer to its first section: `teacher.train` has the keys of `train`)."""
    table, queue = _table("", PipelineConfig)
    defaults = _flatten(PipelineConfig().to_dict())
    lines, seen = [HEADER, "## Top level", "", *table], {}
    while queue:
        path, cls = queue.pop(0)
        lines += [f"## `{path}` ({cls.__name__})", ""]
        if cls in seen:
            same = "the same defaults" if defaults[path] == defaults[seen[cls]] else "other defaults: see the dataclass"
            lines += [f"The keys of [`{seen[cls]}`](#{anchor(seen[cls], cls)}), under `{path}.`; {same}.", ""]
            continue
        seen[cls] = path
        table, nested = _table(path, cls)
        lines += [" ".join((cls.__doc__ or "").split()), "", *table]
        queue += nested
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference())
