"""pyproject.toml: `pip install -e .` installs every package of the repository and two working commands."""
import importlib
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_package_is_installed_and_the_commands_resolve():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(project["tool"]["setuptools"]["packages"])
    found = {str(init.parent.relative_to(REPO)).replace("/", ".") for top in ("reder", "pipeline", "cluster")
             for init in (REPO / top).rglob("__init__.py")}
    assert listed == found  # a new subpackage must be listed, or an installed copy would lack it
    scripts = project["project"]["scripts"]
    assert set(scripts) == {"duplex-pipeline", "duplex-translate"}
    for target in scripts.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target
    assert project["tool"]["setuptools"]["dynamic"]["dependencies"]["file"] == ["requirements.txt"]
