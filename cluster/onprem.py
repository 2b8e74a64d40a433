"""Fill cluster/onprem.yaml's placeholders for your machines and write a checked copy to `ray up`.

    python -m cluster.onprem --head-ip 10.0.0.10 --worker 10.0.0.11 --worker 10.0.0.12 \\
        --ssh-user alice --nfs nfs.example.org:/export/duplex --output my-onprem.yaml
    python -m cluster.onprem --head-ip 127.0.0.1 --ssh-user "$USER" --shared "$HOME/duplex-shared" \\
        --output my-onprem.yaml        # one machine: the head alone, a plain directory as shared storage

Every REPLACE_... of the template is filled; the result must pass `cluster.check` (Ray's validator, the
security rules, no placeholder left) or nothing is written (exit 1, the findings printed). The comments
of the template stay. Without `--nfs` the shared directory is only created, not mounted: right for one
machine, or for machines that already mount one file system at that path (the pipeline's shared-storage
probe stops a run whose nodes do not see the same files).
"""
from __future__ import annotations

import argparse
import io
import os
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path

from cluster import ClusterError

TEMPLATE = Path(__file__).with_name("onprem.yaml")
MOUNT_POINT = "/mnt/shared"
WORKERS = re.compile(r"^(  worker_ips:)([^\n]*)\n(?:    - REPLACE_WORKER_IP_\d+[^\n]*\n)+", re.MULTILINE)
KEY = re.compile(r"^(  ssh_private_key:[ \t]*)(\S+)", re.MULTILINE)
NFS_COMMAND = re.compile(r"^  - >-\n    sudo mkdir -p /mnt/shared && \(mountpoint[^\n]*\n[^\n]*REPLACE_NFS_SERVER[^\n]*\n",
                         re.MULTILINE)


def fill(text: str, head_ip: str, ssh_user: str, workers: list[str] | tuple[str, ...] = (), ssh_key: str = "",
         shared: str = "", nfs: str = "") -> str:
    """The template `text` with every placeholder filled. `shared`: the directory every machine sees
    (default /mnt/shared, where `nfs` "SERVER:EXPORT" is mounted); without `nfs` it is created only."""
    if not nfs and not shared:
        raise ClusterError("say where the shared storage is: --nfs SERVER:EXPORT (mounted at /mnt/shared or "
                           "--shared), or --shared DIR for one machine or a file system every machine mounts there")
    if nfs and ":" not in nfs:
        raise ClusterError(f"--nfs {nfs!r}: expected SERVER:EXPORT, e.g. nfs.example.org:/export/duplex")
    for name, value in (("--head-ip", head_ip), ("--ssh-user", ssh_user), ("--shared", shared), ("--nfs", nfs),
                        ("--ssh-key", ssh_key), *(("--worker", worker) for worker in workers)):
        if re.search(r"[\s'\"`$;&|]", value):
            raise ClusterError(f"{name} {value!r}: no spaces, quotes or shell characters")
    if not WORKERS.search(text) or not NFS_COMMAND.search(text):
        raise ClusterError("the template's worker_ips or NFS lines are not the shipped ones; fill it by hand")
    listing = "".join(f"    - {worker}\n" for worker in workers)
    text = WORKERS.sub(lambda m: f"{m.group(1)}{m.group(2)}\n{listing}" if workers else
                       f"{m.group(1)} []{m.group(2)[3:]}\n", text, count=1)
    if nfs:
        server, export = nfs.split(":", 1)
        text = text.replace("REPLACE_NFS_SERVER:REPLACE_NFS_EXPORT", f"{server}:{export}")
    else:
        text = NFS_COMMAND.sub("  - mkdir -p /mnt/shared             # not mounted: one file system at this path\n",
                               text, count=1)
    if shared:
        text = text.replace(MOUNT_POINT, shared.rstrip("/"))
    text = text.replace("REPLACE_HEAD_IP", head_ip).replace("REPLACE_SSH_USER", ssh_user)
    # Written out in full: `ray up` hands the path to ssh as it is, and ssh expands `~` to the home directory
    # of the account that runs it (from the password database), not to $HOME.
    key = KEY.search(text)
    if key is None:
        raise ClusterError("the template has no auth.ssh_private_key line; fill it by hand")
    path = str(Path(ssh_key or key.group(2)).expanduser().absolute())
    return text[:key.start(2)] + path + text[key.end(2):]


def write_checked(text: str, output: Path) -> int:
    """Write `text` to `output` if `cluster.check` passes it (exit 0); else print the findings, write
    nothing and return the check's exit status."""
    from cluster import check

    output = Path(output)
    partial = output.with_name(f".{output.name}.tmp")
    partial.write_text(text, encoding="utf-8")
    report = io.StringIO()
    try:
        with redirect_stdout(report):
            status = check.check(partial)
        if status == 0:
            os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
    print(report.getvalue().replace(str(partial), str(output)), end="")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.onprem", description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-ip", required=True, help="the head machine's address (SSH and Ray)")
    parser.add_argument("--worker", action="append", default=[], help="a worker machine's address (repeat)")
    parser.add_argument("--ssh-user", required=True, help="the user `ray up` logs in as on every machine")
    parser.add_argument("--ssh-key", default="", help="its private key (default: the template's ~/.ssh/id_ed25519; "
                        "written as an absolute path)")
    parser.add_argument("--nfs", default="", help="SERVER:EXPORT mounted on every machine")
    parser.add_argument("--shared", default="", help=f"the shared directory (default {MOUNT_POINT})")
    parser.add_argument("--template", default=str(TEMPLATE))
    parser.add_argument("--output", required=True, help="the filled YAML (not the template)")
    args = parser.parse_args(argv)
    if Path(args.output).resolve() == Path(args.template).resolve():
        parser.error("--output would overwrite the template")
    try:
        text = fill(Path(args.template).read_text(encoding="utf-8"), args.head_ip, args.ssh_user, args.worker,
                    args.ssh_key, args.shared, args.nfs)
    except ClusterError as error:
        print(f"{args.template}: {error}", file=sys.stderr)
        return 1
    status = write_checked(text, Path(args.output))
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
