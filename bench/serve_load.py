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

What a service owner checks before trusting it (`--checks soak,kill,storm`, REDER greedy only, each answer
compared with `reder.api`'s own translation of its sentence):

    python -m bench.serve_load --checks soak,kill,storm [--reder DIR] [--concurrency 4] [--soak-seconds 600]
        [--out FILE]

- soak: `--soak-seconds` at the first `--concurrency`, the replica's resident memory sampled every
  `--sample-seconds`: p50/p99 latency per minute and over the run, errors, requests given up (lost: every request
  sent ends answered or given up), wrong answers, and the RSS slope (MB/min, least squares) after the first fifth of the run (warm-up);
- kill: the replica SIGKILLed (as the OOM killer does) a third into `--kill-seconds`; Serve starts another, and
  the client retries a failed request (every 0.2 s, for up to 60 s): failed attempts, given-up requests, wrong
  answers, and the longest time without an answer after the kill;
- storm: `--storm` requests at once, far past what the replica holds and queues (2 × max_batch_size + the
  deployment's max_queued_requests): how many were answered, refused with 503 and Retry-After (and how fast),
  failed otherwise; the answered ones' p99 stays bounded by the queue, not by the storm.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

from bench import emit, free_port, peers

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
            start = time.perf_counter()
            status, answer, _ = ask(url, lines[number % len(lines)], beam)
            if status != 200:  # counted, not raised: a load test reports failures
                with lock:
                    errors.append(f"{status}: {answer}")
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
    return {"requests": len(latencies), "errors": len(errors), "first_error": errors[0] if errors else None,
            "seconds": round(elapsed, 2), "sentences_per_s": round(len(latencies) / elapsed, 2),
            **_percentiles(latencies),
            "mean_ms": round(1000 * statistics.fmean(latencies), 1) if latencies else None,
            "mean_output_words": round(statistics.fmean(outputs), 2) if outputs else None}


def _percentiles(latencies: list[float]) -> dict[str, float | None]:
    ordered = sorted(latencies)
    at = lambda q: round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else None  # noqa: E731
    return {"p50_ms": at(0.5), "p99_ms": at(0.99)}


def ask(url: str, text: str, beam: int = 1, timeout: float = 120) -> tuple[int, str | None, float | None]:
    """One request: (HTTP status, translation or the error's text, Retry-After seconds of a refusal); status 0
    when no HTTP answer came (the connection refused or cut)."""
    body = json.dumps({"text": text, "src": "en", "tgt": "de", "beam": beam}).encode()
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())["translation"], None
    except urllib.error.HTTPError as error:
        retry_after = error.headers.get("Retry-After")
        return error.code, error.read().decode(errors="replace")[:200], float(retry_after) if retry_after else None
    except OSError as error:  # refused, reset, timed out
        return 0, f"{type(error).__name__}: {error}"[:200], None


def drive_checked(url: str, lines: list[str], expected: dict[str, str], concurrency: int, seconds: float,
                  retry_for_s: float = 0.0, retry_wait_s: float = 0.2, on_answer: Callable[[float], None] | None = None
                  ) -> dict[str, Any]:
    """`concurrency` clients sending one sentence a request for `seconds`, a failed request retried every
    `retry_wait_s` for up to `retry_for_s`: answered, failed attempts (by status), given up, wrong answers (not
    `expected[sentence]`), latency from the first attempt to the answer. `on_answer(t)` hears every answer's
    time (time.monotonic)."""
    latencies: list[tuple[float, float]] = []  # (answered at, seconds since the first attempt)
    failed: dict[str, int] = {}
    counts = {"sent": 0, "answered": 0, "given_up": 0, "wrong": 0}
    first_wrong: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < deadline:
            with lock:
                line = lines[counts["sent"] % len(lines)]
                counts["sent"] += 1
            start = time.monotonic()
            while True:
                status, answer, _ = ask(url, line)
                if status == 200:
                    break
                with lock:
                    failed[str(status)] = failed.get(str(status), 0) + 1
                if time.monotonic() - start >= retry_for_s:
                    break
                time.sleep(retry_wait_s)
            done = time.monotonic()
            with lock:
                if status != 200:
                    counts["given_up"] += 1
                    continue
                counts["answered"] += 1
                latencies.append((done, done - start))
                if answer != expected[line]:
                    counts["wrong"] += 1
                    first_wrong[:] = first_wrong or [f"{line!r} -> {answer!r}, expected {expected[line]!r}"]
            if on_answer is not None:
                on_answer(done)

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    by_minute: dict[int, list[float]] = {}
    for done, latency in latencies:
        by_minute.setdefault(int((done - started) // 60), []).append(latency)
    return {**counts, "failed_attempts": failed, "first_wrong": first_wrong[0] if first_wrong else None,
            "seconds": round(elapsed, 1), "sentences_per_s": round(counts["answered"] / elapsed, 2),
            **_percentiles([latency for _, latency in latencies]),
            "max_ms": round(1000 * max(latency for _, latency in latencies), 1) if latencies else None,
            "by_minute": [{"minute": m, "answered": len(v), **_percentiles(v)} for m, v in sorted(by_minute.items())]}


def replica_pid(app: str) -> int | None:
    """The process of the application's (one) replica: Ray names it `ray::ServeReplica:<app>:<deployment>`."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        if any(part.startswith(f"ray::ServeReplica:{app}:") for part in proc.info["cmdline"] or ()):
            return proc.pid
    return None


def soak(url: str, app: str, lines: list[str], expected: dict[str, str], concurrency: int, seconds: float,
         sample_s: float = 10.0) -> dict[str, Any]:
    """The soak (module doc): the run's figures, each minute's p50/p99, and the replica's RSS and its slope."""
    import psutil

    pid = replica_pid(app)
    rss: list[tuple[float, float]] = []  # (minutes since the start, MB)
    began = time.monotonic()
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(drive_checked(url, lines, expected, concurrency, seconds)))
    worker.start()
    while worker.is_alive():
        try:
            rss.append(((time.monotonic() - began) / 60, psutil.Process(pid).memory_info().rss / 2**20))
        except (psutil.Error, TypeError):  # gone (counted below as a restart), or never found
            pass
        worker.join(timeout=sample_s)
    warm = [(t, m) for t, m in rss if t >= seconds / 60 / 5]
    slope = None
    if len(warm) >= 3:
        mean_t, mean_m = statistics.fmean(t for t, _ in warm), statistics.fmean(m for _, m in warm)
        slope = sum((t - mean_t) * (m - mean_m) for t, m in warm) / sum((t - mean_t) ** 2 for t, _ in warm)
    return {**result, "concurrency": concurrency, "replica_pid_unchanged": replica_pid(app) == pid,
            "p99_within_2x_p50": bool(result.get("p99_ms") and result["p99_ms"] <= 2 * result["p50_ms"]),
            "rss_mb_first_last": [round(rss[0][1], 1), round(rss[-1][1], 1)] if rss else None,
            "rss_slope_mb_per_min_after_warmup": round(slope, 3) if slope is not None else None,
            "rss_samples": [[round(t, 2), round(m, 1)] for t, m in rss]}


def kill_replica(url: str, app: str, lines: list[str], expected: dict[str, str], concurrency: int,
                 seconds: float) -> dict[str, Any]:
    """The replica SIGKILLed a third into a run whose clients retry (module doc)."""
    pid = replica_pid(app)
    if pid is None:
        raise RuntimeError(f"no replica process of application {app!r} found")
    answers: list[float] = []
    killed_at: list[float] = []
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(drive_checked(
        url, lines, expected, concurrency, seconds, retry_for_s=60, on_answer=answers.append)))
    worker.start()
    time.sleep(seconds / 3)
    os.kill(pid, signal.SIGKILL)
    killed_at.append(time.monotonic())
    worker.join()
    # the service's gap: the longest time without an answer from the kill on (answers already on their way when
    # the replica died still arrive; what counts is how long until they flow again)
    times = sorted([killed_at[0], *(t for t in answers if t > killed_at[0])])
    gap = max((b - a for a, b in zip(times, times[1:])), default=None)
    return {**result, "concurrency": concurrency, "killed_pid": pid, "restarted_as": replica_pid(app),
            "longest_seconds_without_an_answer_after_the_kill": round(gap, 2) if gap is not None else None}


def storm(url: str, lines: list[str], expected: dict[str, str], requests: int) -> dict[str, Any]:
    """`requests` requests at once, no retry (module doc): answered, refused (503), failed, and their latencies."""
    barrier = threading.Barrier(requests)
    outcomes: list[tuple[int, str | None, float | None, float]] = []
    lock = threading.Lock()

    def client(number: int) -> None:
        line = lines[number % len(lines)]
        barrier.wait()
        start = time.monotonic()
        status, answer, retry_after = ask(url, line)
        with lock:
            outcomes.append((status, answer if status != 200 else answer == expected[line], retry_after,
                             time.monotonic() - start))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    answered = [o for o in outcomes if o[0] == 200]
    refused = [o for o in outcomes if o[0] == 503]
    other = [o for o in outcomes if o[0] not in (200, 503)]
    return {"requests": requests, "answered": len(answered), "wrong": sum(o[1] is not True for o in answered),
            "refused_503": len(refused), "refused_with_retry_after": sum(o[2] is not None for o in refused),
            "refusal_text": refused[0][1] if refused else None, "failed_otherwise": len(other),
            "first_other": f"{other[0][0]}: {other[0][1]}" if other else None,
            "answered_latency": _percentiles([o[3] for o in answered]),
            "refused_latency": _percentiles([o[3] for o in refused])}


def run_checks(url: str, app: str, model_dir: str, lines: list[str], checks: list[str],
               args: argparse.Namespace) -> dict[str, Any]:
    """The checks named (module doc) against the REDER application `app` at `url`, in the order soak, kill, storm;
    the expected answers are reder.api's own greedy translations of the lines."""
    from reder.api import load

    expected = dict(zip(lines, load(model_dir).translate(lines, "en", "de")))
    concurrency = int(args.concurrency.split(",")[0])
    drive_checked(url, lines[:4], expected, 1, 2.0)  # warm-up
    out: dict[str, Any] = {}
    if "soak" in checks:
        out["soak"] = soak(url, app, lines, expected, concurrency, args.soak_seconds, args.sample_seconds)
    if "kill" in checks:
        out["kill"] = kill_replica(url, app, lines, expected, concurrency, args.kill_seconds)
    if "storm" in checks:
        out["storm"] = storm(url, lines, expected, args.storm)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--requests", type=int, default=200, help="answers per system and concurrency (at most)")
    parser.add_argument("--seconds", type=float, default=30.0, help="time per system and concurrency (at most)")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--checks", default="", help="soak,kill,storm (module doc): REDER only, instead of the load test")
    parser.add_argument("--soak-seconds", type=float, default=600.0)
    parser.add_argument("--sample-seconds", type=float, default=10.0, help="the soak's RSS sampling period")
    parser.add_argument("--kill-seconds", type=float, default=60.0)
    parser.add_argument("--storm", type=int, default=512, help="requests sent at once by the storm")
    parser.add_argument("--max-queued-requests", type=int, help="the deployment's (default: pipeline/serve.py's)")
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
    checks = [c for c in args.checks.split(",") if c]
    unknown = sorted(set(checks) - {"soak", "kill", "storm"})
    if unknown:
        parser.error(f"--checks: unknown {unknown}; choose from soak, kill, storm")
    queued = {} if args.max_queued_requests is None else {"max_queued_requests": str(args.max_queued_requests)}
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        dirs = _models(model_args, Path(tmp))
        ray.init(address="local", num_cpus=model_args.threads + 1, include_dashboard=False, log_to_driver=False)
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        try:
            if checks:
                serve.run(service.app({"model_dir": dirs["reder"], "threads": str(model_args.threads),
                                       "max_batch_size": str(args.max_batch_size), "batch_wait_timeout_s": "0.01",
                                       **queued}), name="reder", route_prefix="/reder")
                report["checks"] = run_checks(f"http://127.0.0.1:{port}/reder", "reder", dirs["reder"], lines, checks,
                                              args)
            for system in args.systems.split(",") if not checks else ():
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
    return emit(report, model_args.out)


if __name__ == "__main__":
    main()
