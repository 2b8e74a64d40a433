"""Machines of their own on this one machine, for the cluster tests (root on Linux, iproute2 and util-linux).

A host is a set of Linux namespaces around one sshd, its first process:
- network: its own address on a private bridge (`dpx-br0`, 10.213.0.0/24; this machine's side of it is the
  operator's, `OPERATOR_IP`), its own loopback and ports, no route anywhere else;
- PID: its own process tree. The SSH user's `ray stop` on one host ends nothing on the other, and killing
  the sshd ends every process of the host at once, as a power cut would (`Host.lose`);
- mount: its own /tmp (a tmpfs; what the test needs of the machine's /tmp is bound back) holding a /tmp/ray
  made 755 by root, as a root `ray up` on a fresh machine leaves it: a Ray of the SSH user that falls back
  on Ray's machine-wide default directory fails on every machine, not only on new ones; and its own home
  directory for the SSH user (the same path on every host, different files, as on separate machines);
- UTS: its own host name (`duplex-<name>`).
Shared between hosts, as NFS would be: everything else on disk, the test's `shared/` directory included.

Every host's process dies with the test process (the kernel's parent-death signal on `unshare`, whose
--kill-child takes the sshd and with it the whole PID namespace), so a killed test leaves no sshd, Ray or
MLflow process; namespaces, bridge and user that a killed run left are removed by the next one first.
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.213.0"
OPERATOR_IP = f"{SUBNET}.254"
BRIDGE = "dpx-br0"
PREFIX = "dpx-"  # network namespaces and the bridge's ports
NETNS_ETC = Path("/etc/netns")  # per-namespace files `ip netns exec` binds over /etc
HOLD = Path("/run/duplex-hosts")  # where a host's mount namespace keeps the machine's /tmp while it binds parts back
# The hosts' processes run at a lower priority than the rest of the test suite, beside which the cluster test
# runs: two Ray nodes advertise 4 CPUs on a 2-core machine, and a 3-trial sweep on them starved a fault test's
# `ray.init` of the CPU its raylet needed to register within Ray's fixed 30 s (CI runs on this box failed so).
# A nice value alone does not hold: with the kernel's autogroups (kernel.sched_autogroup_enabled, 1 here) every
# session (each SSH login, each `ray start`) is scheduled as one entity of nice 0 whatever its processes' nice,
# and their nice counts only among themselves. Measured on the 2-core box beside four busy loops at nice 10, each
# in a session of its own: a new local `ray.init` took 29.5 s, and 8.6 s with the loops in one CPU cgroup of
# weight CPU_SHARE. So each host starts inside that cgroup (tasks outside the root cgroup have no autogroup); its
# processes still get NICENESS, which matters only where no CPU cgroup can be made.
NICENESS = 10
CPU_GROUP = "dpx-hosts"
# The hosts together, against one session of the suite, when the CPU is short: a tenth, so that the `ray up` test's
# background work (~760 CPU-s, with the whole suite to finish in) takes mostly the CPU the tests beside it leave.
# Measured on the 2-core box (docs/results/ci.md): the fault drill beside it 381 s at 0.5, 302 s at 0.1 (293 s alone),
# every bound of the background still held; in a whole CI run the later, torch-bound tests ran slower, 34 s less in all.
CPU_SHARE = 0.1
REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS = {"/usr/sbin/sshd": "openssh-server", "/usr/bin/rsync": "rsync", "/usr/bin/setfacl": "acl",
         "/usr/sbin/ip": "iproute2", "/usr/bin/unshare": "util-linux", "/usr/bin/setpriv": "util-linux"}


def run(command: list[str], timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=check)


def running_venv() -> Path:
    """The virtual environment running this suite, wherever it lives: the hosts' ~/duplex/.venv links to it (not
    to this checkout's .venv, which another environment's run may not have, or have as something else)."""
    return Path(sys.prefix).resolve()


def unavailable() -> str:
    """Why this machine cannot build hosts ("" when it can), after installing missing packages if root."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (network namespaces, a throwaway user, an sshd per host)"
    if sys.prefix == sys.base_prefix:
        return ("needs the suite to run from a virtual environment (each host's ~/duplex/.venv links to it; "
                f"{sys.executable} is not in one)")
    missing = sorted({package for path, package in TOOLS.items() if not Path(path).exists()})
    if missing and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env,
                       capture_output=True, timeout=600)
        missing = sorted({package for path, package in TOOLS.items() if not Path(path).exists()})
    if missing:
        return f"missing {missing} (apt-get install {' '.join(missing)})"
    routes = run(["ip", "-4", "route", "show", "to", "match", f"{SUBNET}.1"], check=False).stdout
    taken = [line for line in routes.splitlines() if not line.startswith("default") and BRIDGE not in line]
    return f"{SUBNET}.0/24 is in use on this machine ({taken[0]})" if taken else ""


def cpu_group() -> Path | None:
    """The hosts' CPU cgroup (made, its weight set to CPU_SHARE of a nice-0 session's): its `cgroup.procs` file,
    which a process joins by writing its pid there; None where neither cgroup v1's cpu controller nor v2's
    cpu.weight can be written at the root of the hierarchy."""
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    try:
        if (v1 / "cpu.shares").is_file():  # a nice-0 session weighs 1024
            group, setting, value = v1 / CPU_GROUP, "cpu.shares", round(1024 * CPU_SHARE)
        elif "cpu" in (v2 / "cgroup.controllers").read_text().split():  # 100
            (v2 / "cgroup.subtree_control").write_text("+cpu")
            group, setting, value = v2 / CPU_GROUP, "cpu.weight", round(100 * CPU_SHARE)
        else:
            return None
        group.mkdir(exist_ok=True)
        (group / setting).write_text(str(value))
    except OSError:
        return None
    return group / "cgroup.procs"


def remove_cpu_group(procs: Path) -> None:
    """Remove the hosts' CPU cgroup once its processes are gone (they may take a moment to be reaped)."""
    for _ in range(50):
        try:
            procs.parent.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def in_cpu_group(pid: int) -> bool:
    """Whether process `pid` is in the hosts' CPU cgroup (either hierarchy)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():  # "ID:CONTROLLERS:PATH", v2's CONTROLLERS ""
        _, controllers, path = line.split(":", 2)
        if path == f"/{CPU_GROUP}" and (not controllers or "cpu" in controllers.split(",")):
            return True
    return False


def remove_leftovers(user: str) -> None:
    """What a killed earlier run left: the user's processes, its namespaces, the bridge, the user."""
    subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
    for line in run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX):
            subprocess.run(["ip", "netns", "pids", name], capture_output=True)
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
    shutil.rmtree(HOLD, ignore_errors=True)
    for etc in NETNS_ETC.glob(f"{PREFIX}*"):
        shutil.rmtree(etc, ignore_errors=True)


def closed_directories(paths: list[Path]) -> list[Path]:
    """Directories above `paths` that other users cannot enter (e.g. /root): the user needs x on them."""
    closed = set()
    for path in paths:
        for directory in [path, *path.parents]:
            if directory.is_dir() and not directory.stat().st_mode & stat.S_IXOTH:
                closed.add(directory)
    return sorted(closed)


def outermost(paths: list[Path]) -> list[Path]:
    """`paths` without those inside another one of them."""
    kept: list[Path] = []
    for path in sorted(set(paths), key=lambda p: len(p.parts)):
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return kept


@dataclass
class Host:
    name: str
    address: str
    home: Path  # this host's home directory of the user, as the machine (and the test) sees it
    process: subprocess.Popen | None = None  # `unshare`, in the machine's PID namespace
    log: Path | None = None

    @property
    def netns(self) -> str:
        return f"{PREFIX}{self.name}"

    def init_pid(self) -> int | None:
        """The host's first process (its sshd), as the machine numbers it; None once the host is gone."""
        if self.process is None or self.process.poll() is not None:
            return None
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        try:
            pids = children.read_text().split()
        except OSError:
            return None
        return int(pids[0]) if pids else None

    def processes(self) -> list[str]:
        """Every process of this host but its sshd listener: "pid user command" lines."""
        init = self.init_pid()
        if init is None:
            return []
        namespace = os.readlink(f"/proc/{init}/ns/pid")
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == init:
                continue
            try:
                if os.readlink(entry / "ns" / "pid") != namespace:
                    continue
                argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                owner = pwd.getpwuid((entry / "cmdline").stat().st_uid).pw_name
            except (OSError, KeyError):
                continue
            if argv:
                found.append(f"{entry.name} {owner} {argv}")
        return found

    def lose(self) -> None:
        """The machine fails: SIGKILL to its first process, which ends every process of the host at once."""
        init = self.init_pid()
        if init is not None:
            os.kill(init, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)  # --kill-child takes the sshd and the PID namespace along
            self.process.wait(timeout=30)


@dataclass
class Hosts:
    """The bridge, the user and one Host per name; `start` each, `close` all (also after a failure)."""
    base: Path
    user: str
    names: tuple[str, ...] = ("head", "worker")
    hosts: dict[str, Host] = field(default_factory=dict)
    cpu_procs: Path | None = None  # the `cgroup.procs` file of the hosts' CPU cgroup (None: NICENESS alone)

    def __post_init__(self) -> None:
        for index, name in enumerate(self.names, start=1):
            self.hosts[name] = Host(name, f"{SUBNET}.{index}", self.base / "hosts" / name / "home")

    @property
    def home(self) -> Path:
        """The user's home directory path (every host binds its own directory there)."""
        return self.base / "home"

    def uid(self) -> int:
        return pwd.getpwnam(self.user).pw_uid

    @property
    def shared(self) -> Path:
        return self.base / "shared"

    def create(self, public_key: Path) -> None:
        """The network, the user (authorised by `public_key` on every host) and each host's files."""
        self.cpu_procs = cpu_group()
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "addr", "add", f"{OPERATOR_IP}/24", "dev", BRIDGE])
        run(["ip", "link", "set", BRIDGE, "up"])
        for host in self.hosts.values():
            outside = f"{host.netns}-r"
            run(["ip", "netns", "add", host.netns])
            run(["ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", host.netns])
            run(["ip", "link", "set", outside, "master", BRIDGE, "up"])
            run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
            run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
            run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
        # Host names resolve as a site's DNS would resolve them (gloo, which DDP runs on, looks its own up):
        # `ip netns exec` binds /etc/netns/<namespace>/hosts over /etc/hosts inside the namespace.
        names = "".join(f"{h.address} duplex-{h.name}\n" for h in self.hosts.values())
        for host in self.hosts.values():
            etc = NETNS_ETC / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n::1 localhost\n{names}", encoding="utf-8")
        run(["useradd", "--no-create-home", "--home-dir", str(self.home), "--shell", "/bin/bash", self.user])
        run(["usermod", "--password", "*", self.user])  # no password, but not locked: sshd lets a key in
        for directory in closed_directories(self.needed_paths()):
            run(["setfacl", "-m", f"u:{self.user}:x", str(directory)])
        self.home.mkdir(mode=0o755)
        self.shared.mkdir(mode=0o755)
        for host in self.hosts.values():
            ssh = host.home / ".ssh"
            ssh.mkdir(parents=True, mode=0o700)
            shutil.copy(public_key, ssh / "authorized_keys")
            (ssh / "authorized_keys").chmod(0o600)
            (host.home / "duplex").mkdir()
            (host.home / "duplex" / ".venv").symlink_to(running_venv())  # setup_commands find it
        for path in (self.home, self.shared, *[h.home for h in self.hosts.values()]):
            run(["chown", "-R", f"{self.user}:{self.user}", str(path)])
        sshd = self.base / "sshd"
        sshd.mkdir(mode=0o700)
        for host in self.hosts.values():
            key = sshd / f"{host.name}_ed25519"
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
            (sshd / f"{host.name}_config").write_text("\n".join([
                f"ListenAddress {host.address}", "Port 22", f"HostKey {key}", f"PidFile {sshd / host.name}.pid",
                f"AllowUsers {self.user}", "PermitRootLogin no", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "PubkeyAuthentication yes", "UsePAM no", "StrictModes yes",
                "AllowTcpForwarding yes", ""]), encoding="utf-8")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory

    def needed_paths(self) -> list[Path]:
        """What every host must reach on the machine's disk: the interpreter, this checkout and its venv,
        the test's base directory."""
        return [Path(sys.base_prefix).resolve(), running_venv(), REPO_ROOT, self.base]

    def init_script(self, host: Host) -> str:
        """What runs as the host's first process before it becomes the host's sshd."""
        hold = HOLD / host.name
        tmp = Path("/tmp")
        keep = [p for p in outermost(self.needed_paths()) if tmp in p.parents]
        lines = ["set -eu", f"hostname duplex-{host.name}",
                 f"mkdir -p {hold}", f"mount --bind /tmp {hold}",
                 "mount -t tmpfs -o mode=1777,size=4g duplex-tmp /tmp",
                 "mkdir -m 755 /tmp/ray"]  # as a root `ray up` leaves it on a fresh machine
        for path in keep:
            lines += [f"mkdir -p {path}", f"mount --bind {hold / path.relative_to(tmp)} {path}"]
        lines += [f"umount {hold}", f"mount --bind {host.home} {self.home}",
                  f"exec /usr/sbin/sshd -D -e -f {self.base / 'sshd' / (host.name + '_config')}"]
        return "\n".join(lines)

    def start(self, host: Host) -> None:
        """Boot `host`: its namespaces and its sshd; returns once the sshd answers on port 22."""
        host.log = self.base / "sshd" / f"{host.name}.log"
        # the first process joins the CPU cgroup before anything of the host starts: all of it inherits the group
        join = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.cpu_procs)] if self.cpu_procs else []
        with open(host.log, "ab") as log:
            host.process = subprocess.Popen(
                [*join, "setpriv", "--pdeathsig", "KILL", "nice", "-n", str(NICENESS), "ip", "netns", "exec", host.netns,
                 "unshare", "--pid", "--mount",
                 "--uts", "--fork", "--mount-proc", "--kill-child=SIGKILL", "bash", "-c", self.init_script(host)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not answers(host.address, 22):
            if host.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"host {host.name} did not start: {host.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)

    def close(self) -> None:
        for host in self.hosts.values():
            host.stop()
        try:
            record = pwd.getpwnam(self.user)
        except KeyError:
            record = None
        if record is not None:
            subprocess.run(["pkill", "-KILL", "-u", self.user], capture_output=True)
            for directory in closed_directories(self.needed_paths()):
                subprocess.run(["setfacl", "-x", f"u:{self.user}", str(directory)], capture_output=True)
            subprocess.run(["userdel", "--force", self.user], capture_output=True)
        remove_leftovers(self.user)
        if self.cpu_procs is not None:
            remove_cpu_group(self.cpu_procs)


def answers(address: str, port: int, timeout_s: float = 1.0) -> bool:
    with socket.socket() as probe:
        probe.settimeout(timeout_s)
        return probe.connect_ex((address, port)) == 0
