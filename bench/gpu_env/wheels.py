"""pack.sh's Python half (standard library only): pick the wheels of a pip resolution report that the GPU
machine lacks, and unpack wheels into one site directory without pip, pruned of what the pipeline never
imports. `python3 wheels.py select REPORT HAVE SKIP` prints `name==version` lines; `python3 wheels.py unpack
WHEEL_DIR SITE PRUNE` fills SITE. HAVE, SKIP and PRUNE are whitespace-separated lists (pack.sh keeps them)."""
from __future__ import annotations

import json
import re
import shutil
import sys
import zipfile
from pathlib import Path


def canonical(name: str) -> str:
    """PEP 503 normalised project name (Flask_CORS -> flask-cors)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def select(report: Path, have: set[str], skip: set[str]) -> list[str]:
    """`name==version` of every distribution pip resolved that is neither on the GPU machine nor skipped."""
    resolved = json.loads(report.read_text(encoding="utf-8"))["install"]
    picked = []
    for item in resolved:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if canonical(name) not in have | skip:
            picked.append(f"{name}=={version}")
    unknown = (have | skip) - {canonical(i["metadata"]["name"]) for i in resolved}
    for name in sorted(unknown):  # not an error: the resolution for another Python may not pull it
        print(f"note: {name} is listed in HAVE/SKIP but pip did not resolve it", file=sys.stderr)
    return sorted(picked, key=str.lower)


def unpack_wheel(wheel: Path, site: Path) -> None:
    """Extract one wheel into `site` as an installer would for purelib/platlib, keeping the executable bits
    (Ray's gcs_server and raylet are binaries in the wheel; zipfile drops modes, so they are set here).
    `<dist>.data/{purelib,platlib}` go to the site root; scripts, headers and data are left out."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            parts = info.filename.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            if info.is_dir() or not parts[-1]:
                continue
            target = site.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, open(target, "wb") as sink:
                shutil.copyfileobj(source, sink)
            mode = (info.external_attr >> 16) & 0o777
            target.chmod(0o755 if mode & 0o111 else 0o644)


def unpack(wheel_dir: Path, site: Path, prune: list[str]) -> None:
    """Every wheel of `wheel_dir` into `site`, then the paths `prune` (relative to `site`) removed; a pruned
    path that is not there is an error (the layout changed: check the list)."""
    wheels = sorted(wheel_dir.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"error: no wheels in {wheel_dir}")
    for wheel in wheels:
        unpack_wheel(wheel, site)
    missing = [p for p in prune if not (site / p).exists()]
    if missing:
        raise SystemExit(f"error: paths to prune are not in the bundle: {' '.join(missing)}")
    for path in prune:
        target = site / path
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    pth = sorted(p.name for p in site.glob("*.pth"))
    if pth:  # PYTHONPATH entries do not run .pth files: say so rather than ship a half-working package
        raise SystemExit(f"error: {', '.join(pth)} would be ignored on PYTHONPATH; handle them in pack.sh")


def main(argv: list[str]) -> None:
    if len(argv) == 4 and argv[0] == "select":
        for line in select(Path(argv[1]), set(map(canonical, argv[2].split())), set(map(canonical, argv[3].split()))):
            print(line)
    elif len(argv) == 4 and argv[0] == "unpack":
        unpack(Path(argv[1]), Path(argv[2]), argv[3].split())
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
