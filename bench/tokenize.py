"""Tokenization throughput: plain single-process SentencePiece vs the Ray stage with 1 and 2 workers.

    python -m bench.tokenize [--data-dir ../shared/data/multi30k] [--scale 1] [--repeats 3]
    python -m bench.tokenize --fresh-cpus 16 [--fresh-workers 0 1 15] [--repeats 3]

Prints one JSON object. Every timing is the best of `--repeats` runs. On Multi30k train (29k pairs):
- `plain`: the stage's own `Tokenizer` called in this process on the whole table (encode both sides,
  lengths, feasibility flags), no Ray; `plain_encode_only` is bare `sp.encode` of both sides.
- `ray_w1`, `ray_w2`: the stage's `tokenize_files` (Ray Data read -> actor pool -> write, then the
  driver's sort/filter/write) with 1 and 2 actors; Ray already running.
- `fixed_overhead_s`: the same Ray path on a 64-pair input, i.e. what the stage costs with ~no work;
  `overhead_vs_plain_s` = ray_w1 - plain; `ray_init_s` is `ray.init()` itself.
- `work_speedup_w1_to_w2` = (ray_w1 - fixed) / (ray_w2 - fixed): scaling on the work itself.
With `--fresh-cpus N` instead, what a pipeline run's tokenize stage meets: each run in a process of its own that
starts a new local Ray of N CPUs (N may exceed the machine's cores: Ray then runs N actors on fewer cores) and
runs the stage's `tokenize_files` once, for each `--fresh-workers` count (0: the stage's own plan), the counts
taking turns, `--repeats` each; `fresh` gives each count's median `ray_init_s` and `tokenize_s` (actors started,
read, tokenized and written, and the driver's pass) and the runs themselves.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import sentencepiece

from bench import MULTI30K


def _best(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(MULTI30K), help="Multi30k directory (train.en, train.de, ...)")
    parser.add_argument("--scale", type=int, default=1, help="repeat the train split this many times")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fresh-cpus", type=int, default=0, help="time the stage on a new Ray of this many CPUs")
    parser.add_argument("--fresh-workers", type=int, nargs="+", default=[0, 1],
                        help="actor counts to time with --fresh-cpus (0: the stage's plan)")
    parser.add_argument("--child", nargs=3, metavar=("INPUT_DIR", "MODEL", "WORKERS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _fresh_child(Path(args.child[0]), Path(args.child[1]), int(args.child[2]), args.fresh_cpus, args.batch_size)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from pipeline import graph
    from pipeline.stages import spm, tokenize
    from pipeline.stages.tokenize_actor import Tokenizer
    from pipeline.parquet import write_split
    from pipeline.config import load_config

    work = Path(tempfile.mkdtemp(prefix="bench-tokenize-"))
    try:
        cfg = load_config(None, ["data.source=multi30k", "data.src_lang=en", "data.tgt_lang=de",
                                 f"data.local_dir={Path(args.data_dir).resolve()}", "data.download=false",
                                 f"model.vocab_size={args.vocab_size}", "tracking.enabled=false"])
        corpus = graph.run(cfg, work, "ingest")
        model_proto = (graph.run(cfg, work, "spm") / spm.MODEL_FILE).read_bytes()
        table = pq.read_table(corpus / "train")
        table = pa.concat_tables([table] * args.scale) if args.scale > 1 else table
        if args.scale > 1:
            offsets = [i * (table.num_rows // args.scale) for i in range(args.scale)]
            ids = [row + offset for offset in offsets for row in range(table.num_rows // args.scale)]
            table = table.set_column(0, "id", pa.array(ids, pa.int64()))
        bench_dir = work / "bench-input" / "train"
        write_split(table, bench_dir)
        files = sorted(bench_dir.glob("*.parquet"))
        tiny_dir = work / "bench-tiny" / "train"
        write_split(table.slice(0, 64), tiny_dir)
        tiny = sorted(tiny_dir.glob("*.parquet"))
        pairs = table.num_rows
        if args.fresh_cpus:
            (work / "spm.model").write_bytes(model_proto)
            return _fresh(bench_dir, work / "spm.model", args, pairs)

        processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        src, tgt = table.column("src").to_pylist(), table.column("tgt").to_pylist()
        encode_only = _best(lambda: (processor.encode(src, num_threads=1), processor.encode(tgt, num_threads=1)),
                            args.repeats)
        udf = Tokenizer(model_proto, cfg.model.upsample_ratio)
        plain = _best(lambda: udf(table.append_column("path", pa.array([str(files[0])] * pairs))), args.repeats)

        import ray

        started = time.perf_counter()
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        ray_init = time.perf_counter() - started

        def stage(inputs: list[Path], workers: int) -> None:
            out = work / f"out-{workers}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            tokenize.tokenize_files(inputs, out, model_proto, cfg.model.upsample_ratio, workers, args.batch_size)

        stage(tiny, 1)  # warm-up: first Ray Data execution imports and starts worker processes
        fixed = _best(lambda: stage(tiny, 1), args.repeats)
        ray_w1 = _best(lambda: stage(files, 1), args.repeats)
        ray_w2 = _best(lambda: stage(files, 2), args.repeats)
        ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "pairs": pairs, "sentences": 2 * pairs, "scale": args.scale, "vocab_size": args.vocab_size,
        "cpus": os.cpu_count(), "machine": platform.platform(), "python": platform.python_version(),
        "ray": ray.__version__, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": {"plain_encode_only": round(encode_only, 3), "plain": round(plain, 3),
                    "ray_init": round(ray_init, 3), "fixed_overhead": round(fixed, 3),
                    "ray_w1": round(ray_w1, 3), "ray_w2": round(ray_w2, 3)},
        "sentences_per_s": {"plain_encode_only": round(2 * pairs / encode_only), "plain": round(2 * pairs / plain),
                            "ray_w1": round(2 * pairs / ray_w1), "ray_w2": round(2 * pairs / ray_w2)},
        "overhead_vs_plain_s": round(ray_w1 - plain, 3),
        "fixed_overhead_s": round(fixed, 3),
        "work_speedup_w1_to_w2": round((ray_w1 - fixed) / max(ray_w2 - fixed, 1e-9), 3),
        "targets": {"overhead_vs_plain_le_10s": ray_w1 - plain <= 10.0,
                    "work_speedup_ge_1.6": (ray_w1 - fixed) / max(ray_w2 - fixed, 1e-9) >= 1.6},
    }
    print(json.dumps(result, indent=2))
    return result


def _fresh(input_dir: Path, model: Path, args: argparse.Namespace, pairs: int) -> dict:
    """Each `--fresh-workers` count `--repeats` times, in turns, each run a process of its own (`_fresh_child`)."""
    runs = []
    for _ in range(args.repeats):
        for workers in args.fresh_workers:
            child = subprocess.run([sys.executable, "-m", "bench.tokenize", "--fresh-cpus", str(args.fresh_cpus),
                                    "--batch-size", str(args.batch_size), "--child", str(input_dir), str(model),
                                    str(workers)], capture_output=True, text=True, check=True)
            runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    fresh = {str(w): {key: statistics.median(r[key] for r in runs if r["requested"] == w)
                      for key in ("ray_init_s", "tokenize_s", "actors")} for w in args.fresh_workers}
    result = {"pairs": pairs, "cpus": os.cpu_count(), "ray_cpus": args.fresh_cpus, "machine": platform.platform(),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "load_average": os.getloadavg()[0],
              "fresh": fresh, "runs": runs}
    print(json.dumps(result, indent=2))
    return result


def _fresh_child(input_dir: Path, model: Path, workers: int, cpus: int, batch_size: int) -> dict:
    """One run on a new local Ray of `cpus` CPUs: its start, then the stage's tokenize_files; one JSON line."""
    import ray

    from pipeline.stages import tokenize

    started = time.perf_counter()
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    ray_init = time.perf_counter() - started
    out = Path(tempfile.mkdtemp(prefix="bench-tokenize-fresh-"))
    try:
        started = time.perf_counter()
        report = tokenize.tokenize_files(sorted(input_dir.glob("*.parquet")), out, model.read_bytes(), 2.0, workers,
                                         batch_size)
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()
        shutil.rmtree(out, ignore_errors=True)
    result = {"requested": workers, "actors": report["workers"], "ray_init_s": round(ray_init, 3),
              "tokenize_s": round(seconds, 3)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
