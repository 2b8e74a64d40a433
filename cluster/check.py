"""Check a Ray cluster-launcher YAML offline, the way `ray up` will read it, and list unfilled placeholders.

    python -m cluster.check cluster.yaml cluster/onprem.yaml

Runs Ray's own `prepare_config` (defaults merged, the local provider's node types built) then
`validate_config` (the launcher's JSON schema: misspelled or misplaced keys are errors, a head node type
must exist). Exit status: 0 ready, 1 invalid, 3 valid but `REPLACE_...` placeholders remain.
"""
from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any

import yaml

PLACEHOLDER = re.compile(r"\bREPLACE_[A-Z0-9_]+")


def validate(config: dict[str, Any]) -> dict[str, Any]:
    """Ray's launcher checks on a loaded YAML; returns the prepared config, raises on an invalid one."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def placeholders(text: str) -> list[tuple[int, str]]:
    """(line number, placeholder) for every REPLACE_... left in the file's text."""
    return [(number, match) for number, line in enumerate(text.splitlines(), start=1)
            for match in PLACEHOLDER.findall(line.split("#", 1)[0])]


def check(path: Path) -> int:
    text = Path(path).read_text(encoding="utf-8")
    try:
        prepared = validate(yaml.safe_load(text))
    except Exception as error:  # jsonschema.ValidationError, ValueError, click.ClickException from Ray
        print(f"{path}: INVALID — {type(error).__name__}: {str(error).splitlines()[0]}")
        return 1
    types = ", ".join(f"{name} (max {spec.get('max_workers', 0)})" for name, spec in prepared["available_node_types"].items())
    print(f"{path}: valid; head {prepared['head_node_type']}; node types {types}")
    left = placeholders(text)
    for number, name in left:
        print(f"  line {number}: fill in {name} (docs/cluster.md)")
    return 3 if left else 0


def main(argv: list[str] | None = None) -> int:
    paths = (sys.argv[1:] if argv is None else argv) or ["cluster.yaml"]
    return max(check(Path(p)) for p in paths)


if __name__ == "__main__":
    sys.exit(main())
