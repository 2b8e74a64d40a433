"""What glibc's mmap threshold costs a CPU replica's decoding: one process per threshold, as a Serve replica runs.

    python -m bench.replica_memory [--thresholds default 131072 1048576 4194304] [--seconds 40] [--reder DIR]
                                   [--out FILE]

Each threshold gets a fresh process (glibc reads `MALLOC_MMAP_THRESHOLD_` once, at its first allocation) with the
rest of pipeline/serve.py's `CPU_REPLICA_ENV` (oneDNN's caches capped): REDER greedy, one thread, on batches of
1 to 4 random sentences of test 2016 (a replica's dynamic batches at concurrency 4), 100 batches of warm-up, then
`--seconds` of batches: the median and mean ms a batch and the process's RSS at the end. `default` leaves the
threshold to glibc (it rises after each large free). The model: `--reder`, else an untrained one of bench.peers'
size (the soak's, bench/serve_load.py). Memory over time is the soak's to measure (bench.serve_load --checks soak).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

def _decode(model_dir: str, sentences: Path, seconds: float) -> dict[str, float]:
    """In the child: batches decoded for `seconds` after a warm-up; ms a batch and the RSS."""
    import torch

    from reder.api import load

    torch.set_num_threads(1)
    translator = load(model_dir)
    lines = sentences.read_text(encoding="utf-8").splitlines()
    rng = random.Random(0)

    def batch() -> list[str]:
        return [lines[rng.randrange(len(lines))] for _ in range(rng.randint(1, 4))]

    for _ in range(100):
        translator.translate(batch(), "en", "de")
    times: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sentences = batch()
        began = time.perf_counter()
        translator.translate(sentences, "en", "de")
        times.append((time.perf_counter() - began) * 1000)
    rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:")) / 1024
    return {"batches": len(times), "median_ms": round(statistics.median(times), 2),
            "mean_ms": round(statistics.mean(times), 2), "rss_mb": round(rss, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--thresholds", nargs="+", default=["default", "131072", "1048576", "4194304"])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--reder", help="a REDER model directory (default: an untrained one of bench.peers' size)")
    parser.add_argument("--out", help="also write the report to this JSON file")
    parser.add_argument("--child", nargs=3, metavar=("MODEL_DIR", "SENTENCES", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_decode(args.child[0], Path(args.child[1]), float(args.child[2]))))
        return 0
    from bench import peers, serve_load
    from pipeline.serve import CPU_REPLICA_ENV

    with tempfile.TemporaryDirectory(prefix="replica-memory-") as tmp:
        model_args = peers._args([])  # bench.peers' model size and data directory
        model_dir = args.reder or serve_load._models(model_args, Path(tmp))["reder"]
        sentences = Path(model_args.data) / "test_2016_flickr.en"
        rows = []
        for threshold in args.thresholds:
            env = {**os.environ, **CPU_REPLICA_ENV}
            env.pop("MALLOC_MMAP_THRESHOLD_", None)
            if threshold != "default":
                env["MALLOC_MMAP_THRESHOLD_"] = threshold
            done = subprocess.run([sys.executable, "-m", "bench.replica_memory", "--child", model_dir, str(sentences),
                                   str(args.seconds)],
                                  env=env, capture_output=True, text=True, check=True)
            rows.append({"mmap_threshold": threshold, **json.loads(done.stdout.strip().splitlines()[-1])})
            print(json.dumps(rows[-1]), file=sys.stderr)
    report = {"benchmark": "replica_memory", "cores": os.cpu_count(), "threads": 1,
              "load_average": os.getloadavg(), "replica_env": {k: v for k, v in CPU_REPLICA_ENV.items()
                                                               if k != "MALLOC_MMAP_THRESHOLD_"},
              "results": rows}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
