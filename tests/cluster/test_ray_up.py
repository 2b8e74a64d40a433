"""`ray up`, `ray exec`, `ray job submit` and `ray down` for real, on this machine, as docs/cluster.md tells a
user to: the block of commands under "On one machine" in that file is read from it and run line by line.

A throwaway user (its home in a fresh /tmp directory) is the cluster's SSH user, reached through an sshd of
our own on 127.0.0.1:22 that lets in only that user and only with a throwaway key: the head's start
commands run `ray stop`, which ends every Ray process of the SSH user, so it must not be anyone real. The
commands' own side (`~/.ray/auth_token`, `~/.ssh/id_ed25519`) gets a throwaway HOME. Root is needed
(useradd, sshd, ACLs): CI is root; elsewhere the test skips saying why, but under CI=true it fails.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "cluster.md"
MARKER = "<!-- ray-up-one-machine:"
USER = "duplex-rayup"
PACKAGES = {"/usr/sbin/sshd": "openssh-server", "/usr/bin/rsync": "rsync", "/usr/bin/setfacl": "acl"}
PORTS = (22, 5000, 6379, 8265, 10001)  # sshd, MLflow, GCS, dashboard, Ray client (all the head's defaults)
TIMEOUT_S = {"get-auth-token": 60, "cluster.onprem": 60, "ray up": 300, "ray exec": 420, "ray job submit": 480,
             "ray down": 120}

pytestmark = pytest.mark.slow


def doc_commands(text: str) -> list[str]:
    """The commands of the fenced block right after the marker comment in docs/cluster.md."""
    after = text[text.index(MARKER):]
    block = re.search(r"```bash\n(.*?)```", after, re.DOTALL)
    assert block and after.index("```") == block.start(), "the marker must sit right above its ```bash block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_doc_block_is_the_documented_path():
    """What the real test below runs: the one-machine path, from the token to `ray down`."""
    commands = doc_commands(DOC.read_text(encoding="utf-8"))
    assert commands[0].startswith("RAY_AUTH_MODE=token ray get-auth-token --generate")
    assert [c.split()[1] if c.startswith("ray ") else c.split()[2] for c in commands[2:]] == \
        ["up", "exec", "job", "job", "down"]
    assert "run_pipeline.py tune" in commands[-2] and "--working-dir ." in commands[-2]


def unavailable() -> str:
    """Why this machine cannot run the test ("" when it can), after installing missing packages if root."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (a throwaway user, an sshd of our own)"
    missing = [package for path, package in PACKAGES.items() if not Path(path).exists()]
    if missing and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env,
                       capture_output=True, timeout=600)
        missing = [package for path, package in PACKAGES.items() if not Path(path).exists()]
    if missing:
        return f"missing {missing} (apt-get install {' '.join(missing)})"
    taken = [port for port in PORTS if port_taken(port)]
    return f"ports {taken} of 127.0.0.1 are taken (another sshd, Ray head or MLflow server)" if taken else ""


def port_taken(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def run(command: list[str] | str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True, **kwargs)


def user_processes() -> list[str]:
    found = subprocess.run(["ps", "-u", USER, "-o", "pid=,args="], capture_output=True, text=True)
    return [line.strip() for line in found.stdout.splitlines() if line.strip()]


def remove_user() -> None:
    """The throwaway user, its processes, files and ACLs (also what a killed earlier run left)."""
    try:
        record = pwd.getpwnam(USER)
    except KeyError:
        return
    subprocess.run(["pkill", "-KILL", "-u", USER], capture_output=True)
    time.sleep(0.5)
    for directory in acl_directories():
        subprocess.run(["setfacl", "-x", f"u:{USER}", str(directory)], capture_output=True)
    subprocess.run(["userdel", "--force", USER], capture_output=True)
    home = Path(record.pw_dir)
    if home.parent.name.startswith("duplex-rayup-") and home.parent.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(home.parent, ignore_errors=True)
    for leftover in [*Path(tempfile.gettempdir()).glob("*"), *Path(tempfile.gettempdir(), "ray").glob("*")]:
        try:
            if leftover.lstat().st_uid == record.pw_uid:
                shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink()
        except OSError:
            pass


def acl_directories() -> list[Path]:
    """Directories above the interpreter and this checkout that other users cannot enter (e.g. /root)."""
    needed = {Path(sys.base_prefix).resolve(), (REPO_ROOT / ".venv").resolve(), REPO_ROOT}
    closed = set()
    for path in needed:
        for directory in [path, *path.parents]:
            if directory.is_dir() and not directory.stat().st_mode & stat.S_IXOTH:
                closed.add(directory)
    return sorted(closed)


@pytest.fixture(scope="session")
def machine():
    """The throwaway user, its sshd and HOMEs; yields (env for the doc's commands, the user's home)."""
    reason = unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the ray up test: {reason}")
        pytest.skip(reason)
    remove_user()
    base = Path(tempfile.mkdtemp(prefix="duplex-rayup-"))
    base.chmod(0o755)
    home, operator, sshd_dir = base / "home", base / "operator", base / "sshd"
    sshd = None
    previous_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a CI timeout still runs the clean-up below
    try:
        run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash", USER])
        run(["usermod", "--password", "*", USER])  # no password, but not locked: sshd lets a key in
        for directory in acl_directories():
            run(["setfacl", "-m", f"u:{USER}:x", str(directory)])
        for directory in (operator / ".ssh", sshd_dir):
            directory.mkdir(parents=True, mode=0o700)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(sshd_dir / "host_ed25519")])
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "duplex-rayup-test", "-f",
             str(operator / ".ssh" / "id_ed25519")])
        ssh = home / ".ssh"
        ssh.mkdir(mode=0o700)
        shutil.copy(operator / ".ssh" / "id_ed25519.pub", ssh / "authorized_keys")
        (home / "duplex").mkdir()
        (home / "duplex" / ".venv").symlink_to((REPO_ROOT / ".venv").resolve())  # setup_commands find it
        run(["chown", "-R", f"{USER}:{USER}", str(home)])
        (ssh / "authorized_keys").chmod(0o600)
        config = sshd_dir / "sshd_config"
        config.write_text("\n".join([
            "ListenAddress 127.0.0.1", "Port 22", f"HostKey {sshd_dir / 'host_ed25519'}",
            f"PidFile {sshd_dir / 'sshd.pid'}", f"AllowUsers {USER}", "PermitRootLogin no",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
            "UsePAM no", "StrictModes yes", ""]), encoding="utf-8")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                                stderr=open(sshd_dir / "log", "wb"), start_new_session=True)
        deadline = time.monotonic() + 20
        while not port_taken(22):
            assert sshd.poll() is None and time.monotonic() < deadline, (sshd_dir / "log").read_text()
            time.sleep(0.2)
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("RAY_", "MLFLOW_", "DUPLEX_", "PYTEST_"))}
        env.update(HOME=str(operator), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                   SSH_USER=USER, SHARED=str(home / "shared"), CLUSTER_YAML=str(base / "onprem.yaml"),
                   PYTHONUNBUFFERED="1")
        yield env, home, sshd
    finally:
        if sshd is not None and sshd.poll() is None:
            os.killpg(sshd.pid, signal.SIGTERM)
            sshd.wait(timeout=20)
        remove_user()
        shutil.rmtree(base, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous_term)


def mlflow_runs(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, max_results=1000)


class Scenario:
    """The doc's commands in order, each checked for exit 0. The first test runs them up to `ray up` and
    leaves the rest to a background thread, so that the rest of the suite runs beside them (tests/conftest.py
    orders the two tests: first, and last but the wall-clock-limited ones): the pipeline runs and the sweep,
    then what the second test asserts is read from the head's MLflow server, then `ray down` and what of the
    cluster is left on the machine after it. The second test waits for that thread and asserts."""

    def __init__(self, env: dict[str, str], home: Path):
        self.env, self.home = env, home
        self.commands = doc_commands(DOC.read_text(encoding="utf-8"))
        self.outputs: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.error = ""
        self.process: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.runs: list = []  # the head's MLflow runs before `ray down`
        self.left: list[str] | None = None  # the SSH user's processes after `ray down`
        self.cluster_file_left = True

    def fail(self, message: str) -> None:
        self.error = self.error or message  # the first failure is the one to show

    def run(self, command: str) -> None:
        """Run one doc command; its output goes to `outputs`, a failure to `error`."""
        limit = next(seconds for name, seconds in TIMEOUT_S.items() if name in command)
        started = time.monotonic()
        self.process = subprocess.Popen(["bash", "-c", command], cwd=REPO_ROOT, env=self.env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = self.process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            output, _ = self.process.communicate()
            self.fail(f"{command}: still running after {limit} s\n{output[-4000:]}")
            return
        self.outputs[command] = output
        self.seconds[command] = round(time.monotonic() - started, 1)  # no print: other tests' capture would take it
        if self.process.returncode:
            self.fail(f"{command}: exit {self.process.returncode}\n{output[-6000:]}")

    def run_all(self, commands: list[str]) -> None:
        for command in commands:
            if self.error:
                return
            self.run(command)

    def after_ray_up(self, commands: list[str]) -> None:
        """The background thread: the commands before `ray down`, the MLflow runs, `ray down` (always: the
        cluster must not outlive a failure) and what is left after it."""
        try:
            self.run_all(commands[:-1])
            if not self.error:
                info = json.loads((self.home / ".duplex" / "cluster.json").read_text(encoding="utf-8"))
                self.runs = mlflow_runs(info["tracking_uri"])
        except Exception as error:  # reported by the second test
            self.fail(f"reading the head's MLflow runs: {error!r}")
        self.run(commands[-1])
        deadline = time.monotonic() + 60  # Ray, the MLflow server, its watcher and the SSH sessions end
        while user_processes() and time.monotonic() < deadline:
            time.sleep(1)
        self.left = user_processes()
        self.cluster_file_left = (self.home / ".duplex" / "cluster.json").exists()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.thread is not None:
            self.thread.join(timeout=30)


@pytest.fixture(scope="session")
def scenario(machine):
    env, home, _ = machine
    scenario = Scenario(env, home)
    yield scenario
    scenario.stop()


def started(scenario: Scenario) -> None:
    """Up to `ray up` here, then the rest in the background (once)."""
    if scenario.thread is not None:
        return
    up = next(i for i, c in enumerate(scenario.commands) if c.startswith("ray up")) + 1
    scenario.run_all(scenario.commands[:up])
    scenario.thread = threading.Thread(target=scenario.after_ray_up, args=(scenario.commands[up:],), daemon=True)
    if not scenario.error:
        scenario.thread.start()


def test_ray_up_starts_the_head_as_the_docs_say(scenario, machine):
    """The token, the filled YAML, `ray up`: the head's Ray, its MLflow server and the cluster file."""
    _, home, _ = machine
    started(scenario)
    assert not scenario.error, scenario.error
    info = json.loads((home / ".duplex" / "cluster.json").read_text(encoding="utf-8"))
    assert info["tracking_uri"] == "http://127.0.0.1:5000" and info["shared_dir"] == f"{home}/shared/duplex"
    assert info["ray_address"].endswith(":6379")  # the head's GCS by address, never "auto"
    assert stat.S_IMODE(Path(scenario.env["HOME"], ".ray", "auth_token").stat().st_mode) == 0o600


def test_ray_exec_job_submit_and_a_sweep_are_tracked_then_ray_down_leaves_nothing(scenario, machine):
    """The pipeline by `ray exec` and by `ray job submit`, the sweep by `ray job submit`, all in the head's
    MLflow server; then `ray down`."""
    _, _, sshd = machine
    started(scenario)
    scenario.thread.join(timeout=sum(TIMEOUT_S.values()) + 120)
    assert not scenario.thread.is_alive(), "the background commands did not finish"
    assert not scenario.error, scenario.error
    commands, outputs = scenario.commands, scenario.outputs
    job, tune = [c for c in commands if c.startswith("RAY_AUTH_MODE=token ray job submit")]
    for command in (job, tune):
        assert "succeeded" in outputs[command], outputs[command][-3000:]
    # The job's --working-dir is unpacked to a new directory: the first run's stages are found all the same.
    for stage in ("ingest", "spm", "tokenize", "teacher", "distill", "train"):
        assert re.search(rf"^  {stage}\s+skipped \(finished earlier\)", outputs[job], re.MULTILINE), \
            (stage, outputs[job][-3000:])
    assert re.search(r"^  evaluate\s+ran\b", outputs[job], re.MULTILINE)
    check_mlflow(scenario.runs)
    # `ray down`: Ray, the MLflow server, its watcher and the SSH sessions ended; the cluster file went.
    assert commands[-1].startswith("ray down") and commands[-1] in outputs
    assert scenario.left == []
    assert not scenario.cluster_file_left
    os.killpg(sshd.pid, signal.SIGTERM)
    sshd.wait(timeout=20)
    assert not port_taken(22)
    for command, seconds in scenario.seconds.items():  # shown with -rA / -s
        print(f"{seconds:6.1f} s  {command}")


def check_mlflow(runs: list) -> None:
    """Both BLEUs of both pipeline runs and of every trial were in the head's server; nothing was RUNNING."""
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    pipelines = [r for r in runs if re.fullmatch(r"smoke-pipeline-[0-9a-f]+", r.info.run_name or "")]
    assert len(pipelines) == 2, [r.info.run_name for r in runs]
    for run_ in pipelines:
        assert {"test_bleu_src2tgt", "test_bleu_tgt2src"} <= set(run_.data.metrics), run_.data.metrics
    sweeps = [r for r in runs if re.fullmatch(r"smoke-tune-[0-9a-f]+", r.info.run_name or "")]
    assert len(sweeps) == 1
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == sweeps[0].info.run_id]
    assert len(trials) == 3
    for trial in trials:
        assert {"valid_bleu_src2tgt", "valid_bleu_tgt2src"} <= set(trial.data.metrics), trial.data.metrics
    assert all(r.info.status == "FINISHED" for r in [*pipelines, *sweeps, *trials])
