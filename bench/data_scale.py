"""Time and largest process of the data stages at scale (issue 55): `run_pipeline.py --stages ingest,spm,tokenize`.

    python -m bench.data_scale [--data-dir ../shared/data/multi30k] [--scales 100] [--repo .] [--tmp /tmp]

For each scale N, Multi30k en-de with train repeated N times (a copy counter keeps lines unique:
bench/ingest_scale.py's `write_corpus`) is run through

    /usr/bin/time -f %M python run_pipeline.py --config configs/smoke.yaml --stages ingest,spm,tokenize \
        data.local_dir=CORPUS data.src_lang=en data.tgt_lang=de spm.sample_size=200000 workdir=WORK

in the checkout `--repo` (so another commit's code can be measured with the same corpus and interpreter).
The largest process is the largest peak RSS (VmHWM) of any process of the run's tree, the driver and Ray's
processes alike, read from /proc every 0.2 s (`largest_process_mb`, with its command name), and, as a check,
GNU time's %M (the largest of the processes it reaped). Wall seconds of the whole command, each stage's
seconds, directory and a digest of its files (from its manifest.json: equal digests, equal outputs) and the
load average before and after go with it. Prints one JSON
object; the generated files are removed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import MULTI30K, REPO_ROOT
from bench.ingest_scale import write_corpus

STAGES = "ingest,spm,tokenize"
SAMPLE_SIZE = 200_000


def _tree(root: int) -> list[int]:
    """`root` and its descendants now, from /proc/<pid>/stat's parent ids."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def _peak_mb(pid: int) -> tuple[float, str]:
    """(VmHWM in MB, command name) of `pid`, or (0, '') once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0, ""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmHWM" not in fields:
        return 0.0, ""
    return int(fields["VmHWM"].split()[0]) / 1024, fields["Name"].strip()


class TreePeak(threading.Thread):
    """Polls the process tree under `root` and keeps each process's latest peak RSS."""

    def __init__(self, root: int, every_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.root, self.every_s, self.done = root, every_s, threading.Event()
        self.peaks: dict[int, tuple[float, str]] = {}

    def run(self) -> None:
        while not self.done.is_set():
            for pid in _tree(self.root):
                peak, name = _peak_mb(pid)
                if peak > self.peaks.get(pid, (0.0, ""))[0]:
                    self.peaks[pid] = (peak, name)
            self.done.wait(self.every_s)

    def largest(self) -> tuple[float, str]:
        return max(self.peaks.values(), default=(0.0, ""))


def measure(repo: Path, corpus: Path, workdir: Path) -> dict:
    """Run the three stages once in `repo` under /usr/bin/time; seconds, peaks and stage seconds."""
    command = ["/usr/bin/time", "-f", "%M", sys.executable, "run_pipeline.py", "--config", "configs/smoke.yaml",
               "--stages", STAGES, f"data.local_dir={corpus}", "data.src_lang=en", "data.tgt_lang=de",
               f"spm.sample_size={SAMPLE_SIZE}", f"workdir={workdir}"]
    load_before = os.getloadavg()
    started = time.perf_counter()
    log_path = workdir.parent / "run.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=repo, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONPATH": str(repo)})
        sampler = TreePeak(process.pid)
        sampler.start()
        returncode = process.wait()
        sampler.done.set()
        sampler.join()
    seconds = time.perf_counter() - started
    text = log_path.read_text(errors="replace")
    if returncode != 0:
        raise SystemExit(f"run_pipeline failed (exit {returncode}):\n{text[-3000:]}")
    time_mb = int(text.strip().splitlines()[-1]) / 1024
    largest_mb, largest_name = sampler.largest()
    stages = {}
    for stage in STAGES.split(","):  # the manifest's wall seconds of each stage
        manifests = list(workdir.glob(f"{stage}*/manifest.json")) + list(workdir.glob(f"*/{stage}*/manifest.json"))
        if manifests:
            manifest = json.loads(manifests[0].read_text())
            files = json.dumps(manifest.get("files"), sort_keys=True).encode()
            stages[stage] = {"seconds": manifest.get("seconds"), "directory": manifests[0].parent.name,
                             "files_sha256": hashlib.sha256(files).hexdigest()[:16]}
    return {"seconds": round(seconds, 1), "largest_process_mb": round(largest_mb, 1), "largest_process": largest_name,
            "gnu_time_max_rss_mb": round(time_mb, 1), "stages": stages,
            "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(MULTI30K), help="Multi30k directory (train.en, val.en, ...)")
    parser.add_argument("--scales", type=int, nargs="+", default=[100])
    parser.add_argument("--repo", default=str(REPO_ROOT), help="the checkout whose run_pipeline.py runs")
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where the generated corpora go")
    args = parser.parse_args(argv)
    results = []
    for scale in args.scales:
        base = Path(tempfile.mkdtemp(prefix=f"bench-data-{scale}x-", dir=args.tmp))
        try:
            pairs = write_corpus(Path(args.data_dir), base / "corpus", scale)
            (base / "work").mkdir()
            measured = measure(Path(args.repo).resolve(), base / "corpus", base / "work")
            results.append({"scale": scale, "train_pairs": pairs, **measured})
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    report = {"benchmark": "data_scale", "repo": str(Path(args.repo).resolve()),
              "machine": f"{platform.node()} ({os.cpu_count()} CPUs)", "results": results}
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
