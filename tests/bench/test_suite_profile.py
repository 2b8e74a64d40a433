"""bench/suite_profile.py: the plugin's rows in a pytest of its own, and the summary read from them."""
import os
import subprocess
import sys

from bench import REPO_ROOT, suite_profile

TESTS = '''
import time


def test_waits():
    time.sleep(0.6)


def test_computes():
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
'''


def test_each_phase_of_each_test_is_a_row_with_its_own_and_the_machines_cpu(tmp_path):
    (tmp_path / "test_two.py").write_text(TESTS, encoding="utf-8")
    profile = tmp_path / "profile.csv"
    env = dict(os.environ, **{suite_profile.ENV: str(profile)}, PYTHONPATH=str(REPO_ROOT))
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "bench.suite_profile",
                           str(tmp_path / "test_two.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = profile.read_text(encoding="utf-8").splitlines()
    assert len(rows) == 6 and all(row.split(",")[2] in {"setup", "call", "teardown"} for row in rows), rows
    tests = suite_profile.read(profile)
    waits, computes = tests["test_two.py::test_waits"], tests["test_two.py::test_computes"]
    assert waits[0] >= 0.6 and waits[1] < 0.3  # wall, pytest's own CPU
    assert computes[1] >= 0.55 and computes[2] >= 0.5  # its CPU (in 10-ms ticks) is the machine's too
    text = suite_profile.summary(tests, cores=2, top=5)
    assert "| test_two.py | " in text and "by idle capacity:\n" in text
    idle = text.split("by idle capacity:\n")[1].splitlines()
    assert idle[2].startswith("| test_two.py::test_waits | ")  # the test that waited left the most idle
