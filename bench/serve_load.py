"""Load test of the Ray Serve endpoint (pipeline/serve.py) on loopback: REDER against the AR teacher served the
same way, through CTranslate2 and through our own beam search.

    python -m bench.serve_load [--reder MODEL_DIR --teacher MODEL_DIR] [--concurrency 1,8,32]
        [--requests 200] [--seconds 30] [--threads 1] [--systems reder,ct2,teacher]

Each system is deployed alone (a local Ray instance of `--threads` + 1 CPUs, one replica with `--threads`
threads, dynamic batching up to 32 requests or 10 ms), then driven by C client threads (C from
`--concurrency`), each sending one sentence per request (the first `--sentences` lines of Multi30k test-2016
English, round robin) and waiting for its answer, until `--requests` answers or `--seconds` have passed,
whichever is first. Printed per system and concurrency: p50/p99 latency (ms), sentences/s, errors. Systems:
`reder` (greedy), `ct2` (the teacher through CTranslate2, beam 4, engine ct2), `teacher` (the teacher with
our beam search, beam 4, engine torch). Without model directories: untrained models of the peer benchmark's
size (bench/peers.py) — the untrained teacher runs every output to its length limit int(1.2·|x| + 10), so
its numbers bound the AR work from above; the report gives the mean output length of each system.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import free_port, peers

SYSTEMS = {"reder": ("reder", "torch", 1), "ct2": ("teacher", "ct2", 4), "teacher": ("teacher", "torch", 4)}


def _models(args: argparse.Namespace, work: Path) -> dict[str, str]:
    """Model directories: the given ones, or untrained ones of the peer benchmark's size saved into `work`."""
    from reder.checkpoint import save_model_dir

    dirs = {"reder": args.reder, "teacher": args.teacher}
    spm = peers.spm_model(args)
    for name, build, extra in (("reder", peers.reder_model, {}), ("teacher", peers.teacher_model, {"direction": "src2tgt"})):
        if not dirs[name]:
            model = build(argparse.Namespace(**{**vars(args), "reder": None, "teacher": None, "device": "cpu"}), args.vocab)
            dirs[name] = str(save_model_dir(work / name, model.cpu(), spm, "en", "de", extra=extra))
    return dirs


def _drive(url: str, lines: list[str], beam: int, concurrency: int, requests: int, seconds: float) -> dict[str, Any]:
    """C client threads against the endpoint: latencies of the answered requests, sentences/s, errors."""
    latencies: list[float] = []
    outputs: list[int] = []
    errors: list[str] = []
    counter = iter(range(10**9))
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client() -> None:
        while time.perf_counter() < deadline:
            with lock:
                number = next(counter)
            if number >= requests:
                return
            body = json.dumps({"text": lines[number % len(lines)], "src": "en", "tgt": "de", "beam": beam}).encode()
            request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
            start = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    answer = json.loads(response.read())["translation"]
            except Exception as error:  # counted, not raised: a load test reports failures
                with lock:
                    errors.append(f"{type(error).__name__}: {error}"[:200])
                continue
            with lock:
                latencies.append(time.perf_counter() - start)
                outputs.append(len(answer.split()))

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    percentile = lambda q: round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else None  # noqa: E731
    return {"requests": len(latencies), "errors": len(errors), "first_error": errors[0] if errors else None,
            "seconds": round(elapsed, 2), "sentences_per_s": round(len(latencies) / elapsed, 2),
            "p50_ms": percentile(0.5), "p99_ms": percentile(0.99),
            "mean_ms": round(1000 * statistics.fmean(latencies), 1) if latencies else None,
            "mean_output_words": round(statistics.fmean(outputs), 2) if outputs else None}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--requests", type=int, default=200, help="answers per system and concurrency (at most)")
    parser.add_argument("--seconds", type=float, default=30.0, help="time per system and concurrency (at most)")
    parser.add_argument("--max-batch-size", type=int, default=32)
    args, rest = parser.parse_known_args(argv)
    model_args = peers._args(rest)  # --reder/--teacher/--threads/--sentences/model size, as bench.peers takes them
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from pipeline import serve as service
    from pipeline.stages.distill import ctranslate2_installed

    lines = (Path(model_args.data) / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[: model_args.sentences]
    report: dict[str, Any] = {"benchmark": "serve_load", "threads": model_args.threads, "cores": os.cpu_count(),
                              "models": "given" if model_args.reder or model_args.teacher else "untrained (bench/peers.py size)",
                              "max_batch_size": args.max_batch_size, "systems": {}}
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        dirs = _models(model_args, Path(tmp))
        ray.init(address="local", num_cpus=model_args.threads + 1, include_dashboard=False, log_to_driver=False)
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        try:
            for system in args.systems.split(","):
                model, engine, beam = SYSTEMS[system]
                if engine == "ct2" and not ctranslate2_installed():
                    report["systems"][system] = {"skipped": "CTranslate2 is not installed (pip install -e '.[ct2]')"}
                    continue
                serve.run(service.app({"model_dir": dirs[model], "engine": engine, "threads": str(model_args.threads),
                                       "max_batch_size": str(args.max_batch_size), "batch_wait_timeout_s": "0.01"}),
                          name=system, route_prefix=f"/{system}")
                url = f"http://127.0.0.1:{port}/{system}"
                _drive(url, lines[:4], beam, 1, 4, 60)  # warm-up
                report["systems"][system] = {"beam": beam, "engine": engine, **{
                    f"concurrency{c}": _drive(url, lines, beam, c, args.requests, args.seconds)
                    for c in (int(c) for c in args.concurrency.split(","))}}
                serve.delete(system)
        finally:
            serve.shutdown()
            ray.shutdown()
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
