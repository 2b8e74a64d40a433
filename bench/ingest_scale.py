"""Time and peak memory of the ingest stage at scale: Multi30k's training set repeated.

    python -m bench.ingest_scale [--data-dir ../shared/data/multi30k] [--scales 10 100] [--tmp /tmp]

For each scale N the training split is Multi30k's train written N times, every copy after the first with
its copy number in front of both sides (`7: A man ...`), so no line of one copy equals a line of another (the
3 duplicate pairs inside Multi30k stay duplicates within each copy: 3N dropped); valid and test are Multi30k's
as they are. The corpus is generated into a temporary directory under `--tmp` (a `files` corpus, en-de;
removed afterwards) and ingested by `graph.run(cfg, workdir, "ingest")` in a child process, which reports its
wall time and its peak RSS (`ru_maxrss`, measured by the child itself, and the RSS after its imports: most of
the floor is torch, which pipeline.config imports). Prints one JSON object; nothing is committed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import MULTI30K, REPO_ROOT


def write_corpus(source: Path, directory: Path, scale: int) -> int:
    """Multi30k en-de with train repeated `scale` times (a copy counter keeps lines unique); returns pairs."""
    directory.mkdir(parents=True)
    pairs = 0
    for lang in ("en", "de"):
        lines = (source / f"train.{lang}").read_bytes().split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        pairs = len(lines) * scale
        with open(directory / f"train.{lang}", "wb") as out:
            out.write(b"".join(line + b"\n" for line in lines))
            for copy in range(1, scale):
                prefix = f"{copy}: ".encode()
                out.write(b"".join(prefix + line + b"\n" for line in lines))
        for split, stem in (("valid", "val"), ("test", "test_2016_flickr")):
            shutil.copyfile(source / f"{stem}.{lang}", directory / f"{split}.{lang}")
    return pairs


def child(local_dir: str, workdir: str) -> None:
    """Ingest `local_dir` into `workdir` in this process; print seconds and peak RSS as JSON."""
    from pipeline import graph
    from pipeline.config import load_config

    imported_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cfg = load_config(None, ["data.source=files", f"data.local_dir={local_dir}", "data.src_lang=en",
                             "data.tgt_lang=de", f"workdir={workdir}", "tracking.enabled=false"])
    started = time.perf_counter()
    out = graph.run(cfg, Path(workdir), "ingest")
    seconds = time.perf_counter() - started
    report = json.loads((out / "report.json").read_text())
    print(json.dumps({"seconds": round(seconds, 2), "peak_rss_mb": round(resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024, 1), "rss_after_imports_mb": round(imported_mb, 1),
        "train": report["splits"]["train"]}))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(MULTI30K), help="Multi30k directory (train.en, val.en, ...)")
    parser.add_argument("--scales", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where the generated corpora go")
    parser.add_argument("--child", nargs=2, metavar=("LOCAL_DIR", "WORKDIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return {}
    results = []
    for scale in args.scales:
        base = Path(tempfile.mkdtemp(prefix=f"bench-ingest-{scale}x-", dir=args.tmp))
        try:
            pairs = write_corpus(Path(args.data_dir), base / "corpus", scale)
            size_mb = sum(p.stat().st_size for p in (base / "corpus").iterdir()) / 1e6
            done = subprocess.run([sys.executable, "-m", "bench.ingest_scale", "--child", str(base / "corpus"),
                                   str(base / "work")], cwd=REPO_ROOT, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
            if done.returncode != 0:
                raise SystemExit(f"ingest at {scale}x failed:\n{done.stderr[-3000:]}")
            measured = json.loads(done.stdout.strip().splitlines()[-1])
            results.append({"scale": scale, "train_pairs": pairs, "corpus_mb": round(size_mb, 1), **measured})
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    report = {"benchmark": "ingest_scale", "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
              "results": results}
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
