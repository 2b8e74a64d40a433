"""A package the run needs that is missing or broken, as a family: each requirement `run_pipeline.py` imports at its
start, and the three it imports when a stage needs them (mlflow with tracking on, ray at the first Ray stage, torch
at the first stage that trains or decodes: the data stages run without it, in the driver and in their actors), is
shadowed by a module that raises as a missing (ModuleNotFoundError) or broken (ImportError) install does. Each case
must end with exit 2 and one `error:` line naming the package, what is wrong and the command that installs the
requirements, with no traceback; our own modules failing to import stay a traceback (a bug, not the machine)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import run_pipeline

REPO = Path(run_pipeline.__file__).resolve().parent
SMOKE = REPO / "configs" / "smoke.yaml"
AT_START = ("pyarrow", "sentencepiece", "sacrebleu", "yaml", "numpy")
WHEN_NEEDED = {"mlflow": ["tracking.enabled=true", "--stages", "ingest"],
               "ray": ["tracking.enabled=false", "--stages", "ingest,spm,tokenize"],
               # Ray without its dashboard (`ray.dashboard=false`): 2-3 s less, the dashboard not what is tested
               "torch": ["tracking.enabled=false", "ray.dashboard=false", "--stages", "ingest,spm,tokenize,teacher"]}


def run_shadowed(tmp_path: Path, package: str, broken: bool, args: list[str]) -> subprocess.CompletedProcess:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    error = (f"ImportError('initialization failed', name={package!r})" if broken else
             f'ModuleNotFoundError("No module named {package!r}", name={package!r})')
    (shadow / f"{package}.py").write_text(f"raise {error}\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(REPO)])}
    return subprocess.run([sys.executable, str(REPO / "run_pipeline.py"), "--config", str(SMOKE),
                           f"workdir={tmp_path / 'work'}", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


# broken as well as missing: one package read at the start, one imported when a stage needs it (torch's import
# when needed takes the same path as mlflow's, after the data stages: ~15 s more for no other line of code)
@pytest.mark.parametrize("package,broken", [*((p, False) for p in AT_START), ("pyarrow", True),
                                            *((p, False) for p in WHEN_NEEDED), ("mlflow", True)])
def test_a_missing_or_broken_requirement_is_one_line_and_exit_2(tmp_path, package, broken):
    done = run_shadowed(tmp_path, package, broken, WHEN_NEEDED.get(package, ["--stages", "ingest"]))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    how = "fails to import" if broken else "is not installed"
    assert lines[-1].startswith(f"error: the Python package '{package}' {how} in the environment of {sys.executable} ("), lines[-1]
    assert lines[-1].endswith(f"install the requirements there: {sys.executable} -m pip install -r "
                              f"{REPO / 'requirements.txt'}"), lines[-1]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if package == "torch":  # the data stages (the driver, Ray Data's actors) ran without it; the teacher needs it
        assert done.stdout.strip().splitlines()[-1].startswith("[4/4] teacher: running"), done.stdout[-3000:]


def test_our_own_module_failing_to_import_stays_a_traceback(tmp_path):
    """A module of ours that fails to import is a bug in the tree, not the machine: its traceback is shown."""
    assert run_pipeline.dependency_failure(ModuleNotFoundError("No module named 'pipeline.nowhere'",
                                                               name="pipeline.nowhere")) is None
    assert run_pipeline.dependency_failure(ImportError("cannot import name 'x'", name="reder")) is None
    assert run_pipeline.dependency_failure(ImportError("cannot import name 'x'")) is None  # nothing named
    assert "'torch' is not installed" in run_pipeline.dependency_failure(
        ModuleNotFoundError("No module named 'torch.cuda'", name="torch.cuda"))
