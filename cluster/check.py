"""Check a Ray cluster-launcher YAML offline, the way `ray up` will read it, and list unfilled placeholders.

    python -m cluster.check cluster.yaml cluster/onprem.yaml

Runs Ray's own `prepare_config` (defaults merged, the local provider's node types built) then
`validate_config` (the launcher's JSON schema: misspelled or misplaced keys are errors, a head node type
must exist), then the security rules of docs/cluster.md: no security-group rule open to 0.0.0.0/0 or ::/0,
every `ray start` with RAY_AUTH_MODE=token, the dashboard and MLflow not bound to every interface, and the
Ray token file the YAML copies to the nodes (`file_mounts`) not readable by other users of this machine.
Exit status: 0 ready, 1 invalid or insecure (one line per finding), 3 valid but `REPLACE_...` placeholders
remain.
"""
from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any

import yaml

PLACEHOLDER = re.compile(r"\bREPLACE_[A-Z0-9_]+")
OPEN_TO_ALL = ("0.0.0.0/0", "::/0")
EVERY_INTERFACE = r"(?:0\.0\.0\.0|::|\[::\])(?![\w.:])"
DASHBOARD_EVERYWHERE = re.compile(r"--dashboard-host[= ]+['\"]?" + EVERY_INTERFACE)
MLFLOW_EVERYWHERE = re.compile(r"(?:cluster\.head start|mlflow server)\b.*?(?:--host|-h)[= ]+['\"]?" + EVERY_INTERFACE)
TOKEN_AUTH = re.compile(r"\bRAY_AUTH_MODE=token\b")
RAY_START = re.compile(r"\bray start\b")


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


def line_of(text: str, needle: str) -> int:
    """The first line (1-based) whose uncommented part contains `needle`; 0 when none does."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line.split("#", 1)[0]:
            return number
    return 0


def command_lists(config: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(key, commands) for every `*_commands` list, top level and per node type."""
    found = [(key, value) for key, value in config.items() if key.endswith("_commands")]
    for name, spec in (config.get("available_node_types") or {}).items():
        found += [(f"available_node_types.{name}.{key}", value) for key, value in spec.items()
                  if key.endswith("_commands")]
    return [(key, [str(c) for c in value or []]) for key, value in found]


def open_ingress(node: Any, key: str) -> list[tuple[str, str]]:
    """(key path, CIDR) of every CidrIp / CidrIpv6 under `node` that opens to the whole internet."""
    if isinstance(node, dict):
        return [hit for k, v in node.items()
                for hit in ([(f"{key}.{k}", v)] if k in ("CidrIp", "CidrIpv6") and v in OPEN_TO_ALL
                            else open_ingress(v, f"{key}.{k}"))]
    if isinstance(node, list):
        return [hit for i, v in enumerate(node) for hit in open_ingress(v, f"{key}[{i}]")]
    return []


def security_findings(prepared: dict[str, Any], text: str) -> list[tuple[int, str, str]]:
    """(line, key, what is wrong and the fix) for each breach of the cluster's security rules."""
    findings = []
    # Ray's AWS provider builds its security group from `provider.security_group`; node configs may carry
    # their own network settings. Ray adds the rules between the group's members itself.
    scopes = [("provider", prepared.get("provider", {}))] + [
        (f"available_node_types.{name}.node_config", spec.get("node_config", {}))
        for name, spec in (prepared.get("available_node_types") or {}).items()]
    for scope, node in scopes:
        for key, cidr in open_ingress(node, scope):
            findings.append((line_of(text, cidr), key, f"ingress open to {cidr}; fix: your address as a /32 "
                             "(REPLACE_ADMIN_CIDR) — reach Ray and MLflow through SSH"))
    for key, commands in command_lists(prepared):
        for command in commands:
            first = command.splitlines()[0] if command.strip() else command
            line = line_of(text, first.strip()[:40]) if first.strip() else 0
            if RAY_START.search(command) and not TOKEN_AUTH.search(command) \
                    and not any(TOKEN_AUTH.search(c) and "export" in c for c in commands):
                findings.append((line, key, "`ray start` without RAY_AUTH_MODE=token; fix: prefix it with "
                                 "RAY_AUTH_MODE=token (the token travels as ~/.ray/auth_token)"))
            if DASHBOARD_EVERYWHERE.search(command):
                findings.append((line, key, "Ray dashboard bound to every interface; fix: "
                                 "--dashboard-host=127.0.0.1 and `ray dashboard <yaml>` (an SSH tunnel)"))
            if MLFLOW_EVERYWHERE.search(command):
                findings.append((line, key, "MLflow bound to every interface; fix: drop --host (cluster.head binds "
                                 "the node's private address) or give the private address"))
    for remote, local in (prepared.get("file_mounts") or {}).items():  # the Ray token this machine copies out
        path = Path(str(local)).expanduser()
        if Path(str(remote)).name == "auth_token" and path.is_file() and path.stat().st_mode & 0o077:
            findings.append((line_of(text, str(remote)), f"file_mounts.{remote}",
                             f"{path} is readable by other users (mode {path.stat().st_mode & 0o777:o}; Ray "
                             f"writes it 644); fix: chmod 600 {path}"))
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        if not any(RAY_START.search(c) for c in prepared.get(key) or []):
            findings.append((line_of(text, key), key, "no `ray start` here (Ray's defaults run without token "
                             "auth); fix: RAY_AUTH_MODE=token ray start ... as in the shipped YAMLs"))
    return findings


def check(path: Path) -> int:
    text = Path(path).read_text(encoding="utf-8")
    try:
        prepared = validate(yaml.safe_load(text))
    except Exception as error:  # jsonschema.ValidationError, ValueError, click.ClickException from Ray
        print(f"{path}: INVALID — {type(error).__name__}: {str(error).splitlines()[0]}")
        return 1
    findings = security_findings(prepared, text)
    for line, key, what in findings:
        print(f"{path}:{line}: {key}: {what}")
    if findings:
        print(f"{path}: INSECURE — {len(findings)} finding(s), see docs/cluster.md (Security)")
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
