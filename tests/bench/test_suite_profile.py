"""bench/suite_profile.py: the plugin's rows in a pytest of its own, and the summary read from them; the process
accounting summary read from dump-acct's lines."""
import os
import subprocess
import sys

import pytest

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


DUMP = """\
python          |v3|   250.00|    50.00|  1200.00|     0|     0| 42000.00|     0.00|   101|     1|     |       0|__      |Tue Dec  1 01:54:32 2026
ray::RayTrainWo |v3|   700.00|   100.00|  1500.00|     0|     0| 90000.00|     0.00|   102|   101|     |       0|__      |Tue Dec  1 01:55:00 2026
ray::RayTrainWo |v3|   780.00|    60.00|  1400.00|     0|     0| 90000.00|     0.00|   103|   101|     |       0|__      |Tue Dec  1 01:56:00 2026
rm              |v3|     0.00|     0.00|     1.00|     0|     0|  3900.00|     0.00|   104|   101|     |       0|__      |Tue Dec  1 01:57:00 2026
"""


def test_the_accounting_summary_sums_each_commands_processes_and_their_user_and_system_ticks():
    commands = suite_profile.processes(DUMP)
    assert commands["ray::RayTrainWo"] == [2, pytest.approx(16.4)]  # (700 + 100 + 780 + 60) ticks of 1/100 s
    assert commands["python"] == [1, pytest.approx(3.0)] and commands["rm"] == [1, 0.0]
    text = suite_profile.process_summary(commands, top=2)
    assert text.startswith("4 processes ended, 19.4 CPU-s\n")
    rows = text.splitlines()[4:]
    assert rows == ["| ray::RayTrainWo | 2 | 16.4 | 8.20 | 84.5% |", "| python | 1 | 3.0 | 3.00 | 15.5% |"]


def test_a_line_that_is_not_dump_accts_is_refused_with_its_number():
    with pytest.raises(ValueError, match="line 5 has 1 fields"):
        suite_profile.processes(DUMP + "not an accounting record\n")
