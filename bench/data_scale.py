"""Time and largest process of the data stages at scale: `run_pipeline.py --stages ingest,spm,tokenize`.

    python -m bench.data_scale [--data-dir ../shared/data/multi30k] [--scales 100] [--repo .] [--tmp /tmp] [--out F]

For each scale N, Multi30k en-de with train repeated N times (a copy counter keeps lines unique:
bench/ingest_scale.py's `write_corpus`) is run through

    /usr/bin/time -f %M python run_pipeline.py --config configs/smoke.yaml --stages ingest,spm,tokenize \
        data.local_dir=CORPUS data.src_lang=en data.tgt_lang=de spm.sample_size=200000 workdir=WORK

in the checkout `--repo` (so another commit's code can be measured with the same corpus and interpreter).
The largest process is the largest peak RSS (VmHWM) of any process of the run's tree, the driver and Ray's
processes alike, read from /proc every 0.2 s (`largest_process_mb`; the four largest, each with the largest
private (RssAnon) and shared-memory (RssShmem: Ray's object store) parts seen), and, as a check,
GNU time's %M (the largest of the processes it reaped). All processes together: the largest sum of their PSS
(/proc/<pid>/smaps_rollup, a page shared by k processes counted 1/k in each) over the polls
(`all_processes_pss_mb`, with when and each process's share then). Wall seconds of the whole command, each stage's
seconds, directory and a digest of its files but report.json (from its manifest.json: equal digests, equal
outputs) and the load average before and after go with it. Prints one JSON object; the generated files are
removed.
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

from bench import MULTI30K, REPO_ROOT, emit
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


def _memory_mb(pid: int) -> tuple[float, float, float, str]:
    """(VmHWM, RssAnon, RssShmem in MB, command name) of `pid`, or zeros once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0, 0.0, 0.0, ""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmHWM" not in fields:
        return 0.0, 0.0, 0.0, ""
    mb = [int(fields[name].split()[0]) / 1024 for name in ("VmHWM", "RssAnon", "RssShmem")]
    return mb[0], mb[1], mb[2], fields["Name"].strip()


PSS_PARTS = ("Pss_Anon", "Pss_File", "Pss_Shmem")  # private heap, mapped files (libraries), shared memory (the store)


def _pss_mb(pid: int) -> dict[str, float]:
    """The proportional set size of `pid` in MB (each shared page divided among the processes mapping it: the
    sum over processes is what they hold together) as {"Pss": total, and its PSS_PARTS}; {} once it is gone."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    fields = (line.split() for line in rollup.splitlines())
    return {f[0].rstrip(":"): int(f[1]) / 1024 for f in fields if len(f) > 1 and f[0].rstrip(":") in ("Pss", *PSS_PARTS)}


def _command(pid: int) -> str:
    """The first 80 characters of `pid`'s command line (Ray names its workers there: `ray::IDLE`, an actor's
    class), or ""."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return ""


class TreePeak(threading.Thread):
    """Polls the process tree under `root`: each process's peak RSS (VmHWM), and the largest private (RssAnon)
    and shared-memory (RssShmem: Ray's object store, mapped into every worker that touches it) parts seen; and
    the tree's total PSS at each poll, whose largest is what the run's processes held together (a shared page
    counted once), with each process's share at that moment."""

    def __init__(self, root: int, every_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.root, self.every_s, self.done = root, every_s, threading.Event()
        self.peaks: dict[int, list] = {}  # pid -> [VmHWM, max RssAnon, max RssShmem, name]
        self.total_pss_mb, self.total_pss_at = 0.0, {}  # the largest total PSS; pid -> (PSS parts, name, command) then
        self.started = time.monotonic()
        self.total_pss_s = 0.0  # seconds from the start to that largest total

    def run(self) -> None:
        while not self.done.is_set():
            shares = {}
            for pid in _tree(self.root):
                high, anon, shared, name = _memory_mb(pid)
                seen = self.peaks.setdefault(pid, [0.0, 0.0, 0.0, name])
                seen[0], seen[1], seen[2] = max(seen[0], high), max(seen[1], anon), max(seen[2], shared)
                seen[3] = name or seen[3]
                shares[pid] = (_pss_mb(pid), seen[3])
            total = sum(pss.get("Pss", 0.0) for pss, _ in shares.values())
            if total > self.total_pss_mb:
                self.total_pss_mb, self.total_pss_at = total, {pid: (pss, name, _command(pid)) for pid, (pss, name)
                                                               in shares.items()}
                self.total_pss_s = time.monotonic() - self.started
            self.done.wait(self.every_s)

    def total_pss(self) -> dict:
        """The largest total PSS of the tree, when it was seen, its parts (PSS_PARTS) summed, and every process's
        share of it then, largest first (its command line's start, its PSS and parts)."""
        ranked = sorted(self.total_pss_at.values(), key=lambda share: -share[0].get("Pss", 0.0))
        parts = {part: round(sum(pss.get(part, 0.0) for pss, _, _ in ranked), 1) for part in PSS_PARTS}
        return {"total_pss_mb": round(self.total_pss_mb, 1), "at_s": round(self.total_pss_s, 1),
                "processes": len(ranked), "parts_mb": parts,
                "shares": [{"name": name, "command": command, "pss_mb": round(pss.get("Pss", 0.0), 1),
                            **{part: round(pss.get(part, 0.0), 1) for part in PSS_PARTS}}
                           for pss, name, command in ranked]}

    def largest(self, count: int = 4) -> list[dict]:
        """The `count` processes with the largest peak RSS, largest first."""
        ranked = sorted(self.peaks.values(), key=lambda seen: -seen[0])[:count]
        return [{"name": name, "peak_rss_mb": round(high, 1), "max_rss_anon_mb": round(anon, 1),
                 "max_rss_shmem_mb": round(shared, 1)} for high, anon, shared, name in ranked]


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
    largest = sampler.largest()
    stages = {}
    for stage in STAGES.split(","):  # the manifest's wall seconds of each stage
        manifests = list(workdir.glob(f"{stage}*/manifest.json")) + list(workdir.glob(f"*/{stage}*/manifest.json"))
        if manifests:
            manifest = json.loads(manifests[0].read_text())
            files = {name: entry for name, entry in (manifest.get("files") or {}).items() if name != "report.json"}
            files = json.dumps(files, sort_keys=True).encode()  # report.json holds timings
            stages[stage] = {"seconds": manifest.get("seconds"), "directory": manifests[0].parent.name,
                             "files_sha256": hashlib.sha256(files).hexdigest()[:16]}
    together = sampler.total_pss()
    return {"seconds": round(seconds, 1), "largest_process_mb": largest[0]["peak_rss_mb"], "largest_processes": largest,
            "all_processes_pss_mb": together["total_pss_mb"], "all_processes": together,
            "gnu_time_max_rss_mb": round(time_mb, 1), "stages": stages,
            "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(MULTI30K), help="Multi30k directory (train.en, val.en, ...)")
    parser.add_argument("--scales", type=int, nargs="+", default=[100])
    parser.add_argument("--repo", default=str(REPO_ROOT), help="the checkout whose run_pipeline.py runs")
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where the generated corpora go")
    parser.add_argument("--out", help="also write the report to this JSON file (the raw file beside RESULTS)")
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
    return emit(report, args.out)


if __name__ == "__main__":
    main()
