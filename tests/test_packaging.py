"""pyproject.toml: `pip install -e .` installs every package of the repository and three working commands."""
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
    assert set(scripts) == {"duplex-pipeline", "duplex-translate", "duplex-compare"}
    for target in scripts.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target
    assert project["tool"]["setuptools"]["dynamic"]["dependencies"]["file"] == ["requirements.txt"]


def test_ci_runs_the_readme_test_command_with_the_extras_installed():
    """.ci/run's last line is the README's test command, and before it CI installs torch as requirements.txt pins
    it and uv with pip (as the test command does), then with uv pyproject's ct2 and triton extras as pinned there
    (so the CTranslate2 tests, distill's default engine and the DAG kernel's tests run in CI, with the versions
    users get), then the requirements (apt installing Chromium beside them from the start)."""
    lines = [line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.startswith("#")]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    test_command = readme.split("Tests (what CI runs, `.ci/run`")[1].split("```bash\n")[1].split("\n```")[0]
    assert lines[-1] == test_command
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    uv = "uv pip install -q --python .venv/bin/python "
    installed = [line.split(uv)[1].split() for line in lines[:-1] if uv in line]
    assert installed == [[f'"{r}"' for r in extras["ct2"]], ["--no-deps", *[f'"{r}"' for r in extras["triton"]]],
                         ["-r", "requirements.txt"]]  # the requirements while apt installs Chromium
    # torch with pip, pinned as requirements.txt pins it: uv does not read pip's settings (here: where the CPU build
    # lies), and with torch installed it keeps it
    pins = [line for line in (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()
            if line.startswith("torch==")]
    first = next(line for line in lines if "pip install" in line).split(" && ")
    assert len(pins) == 1 and first[0] == "python3 -m venv .venv" and first[1] == test_command.split(" && ")[1]
    assert first[1].startswith(f'.venv/bin/pip install -q --no-compile "{pins[0]}" "uv==')
