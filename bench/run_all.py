"""Run the benchmarks and collect their JSON into one report (JSON + Markdown).

    python -m bench.run_all --workdir runs/default [--only memory,decode_speed] [--out bench/report]

Each benchmark runs as its own process (`python -m bench.<name> ...`, so one's memory or threads never
disturb the next), its stdout's JSON is kept whole, and the report records the command, the exit status,
the wall time and the machine. Benchmarks that need a trained model or tokenized data take them from a
finished pipeline run (`--workdir`: its `last_run.json` names every stage's output); one whose inputs
are missing is listed as skipped with the reason, not silently dropped.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from bench import REPO_ROOT
from pipeline.stage import write_json, write_text



def _stage(run: dict[str, Any], name: str) -> Path | None:
    entry = run.get("stages", {}).get(name)
    return Path(entry["output"]) if entry else None


def _needs(*stages: str) -> Callable[[dict[str, Any]], str]:
    def missing(run: dict[str, Any]) -> str:
        absent = [s for s in stages if _stage(run, s) is None]
        return f"the --workdir run has no finished {absent} stage(s)" if absent else ""
    return missing


# name -> (arguments given the pipeline run's last_run.json, why it cannot run ("" = it can))
SUITE: dict[str, tuple[Callable[[dict[str, Any]], list[str]], Callable[[dict[str, Any]], str]]] = {
    "memory": (lambda run: ["--depths", "2", "4", "8", "16"], lambda run: ""),
    "tokenize": (lambda run: [], lambda run: ""),
    "train_speed": (lambda run: ["--data", str(_stage(run, "tokenize") / "train"), "--vocab-size",
                                 str(run["config"]["model"]["vocab_size"]), "--max-tokens",
                                 str(run["config"]["train"]["max_tokens"])], _needs("tokenize")),
    "decode_speed": (lambda run: ["--workdir", run["workdir"]], _needs("ingest", "teacher", "train")),
    "dag": (lambda run: [], lambda run: ""),
    "distill": (lambda run: ["--teachers", str(_stage(run, "teacher"))], _needs("teacher")),
    "train_scaling": (lambda run: [], lambda run: ""),  # its own run of the default config's data stages
}


def parse_json_output(text: str) -> Any:
    """The JSON a benchmark printed: one document, or every top-level object of a JSON-lines output
    (log lines in between are ignored). None when there is none."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    decoder, found, index = json.JSONDecoder(), [], 0
    while True:
        start = min((i for i in (text.find("{", index), text.find("[", index)) if i >= 0), default=-1)
        if start < 0:
            break
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            index = start + 1
            continue
        found.append(value)
        index = end
    return found[0] if len(found) == 1 else (found or None)


def run_one(name: str, arguments: list[str], timeout_s: float) -> dict[str, Any]:
    command = [sys.executable, "-m", f"bench.{name}", *arguments]
    started = time.time()
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        status, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        status, stdout, stderr = "timeout", expired.stdout or "", f"timed out after {timeout_s} s"
    return {"command": "python -m " + " ".join([f"bench.{name}", *arguments]), "status": status,
            "seconds": round(time.time() - started, 1), "result": parse_json_output(stdout or ""),
            "stderr_tail": (stderr or "")[-2000:] if status != 0 else ""}


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Benchmark report ({report['date']})", "", f"Machine: {report['machine']}", ""]
    for name, entry in report["benchmarks"].items():
        lines.append(f"## {name}")
        if "skipped" in entry:
            lines += ["", f"skipped: {entry['skipped']}", ""]
            continue
        lines += ["", f"`{entry['command']}` — exit {entry['status']}, {entry['seconds']} s", ""]
        result = entry["result"]
        rows = result.get("summary", result) if isinstance(result, dict) else result
        if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
            keys = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], (dict, list))))
            lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
        else:
            lines += ["```json", json.dumps(result, indent=1)[:6000], "```"]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="", help="a finished pipeline run (its last_run.json)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {list(SUITE)}")
    parser.add_argument("--out", default="bench/report", help="writes <out>.json and <out>.md")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(SUITE)
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        parser.error(f"--only: unknown benchmarks {unknown}; known: {list(SUITE)}")
    run: dict[str, Any] = {}
    if args.workdir:
        path = Path(args.workdir).resolve() / "last_run.json"
        if not path.is_file():
            parser.error(f"--workdir: {path} does not exist (run the pipeline there first)")
        run = {**json.loads(path.read_text(encoding="utf-8")), "workdir": str(path.parent)}
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "benchmarks": {},
              "machine": f"{platform.node()}, {platform.processor() or platform.machine()}, "
                         f"{os.cpu_count()} CPUs, Python {platform.python_version()}"}
    for name in names:
        make_arguments, blocker = SUITE[name]
        reason = "" if (REPO_ROOT / "bench" / f"{name}.py").is_file() else f"bench/{name}.py does not exist yet"
        if not reason:
            reason = blocker(run) if run else ("needs --workdir (a finished pipeline run)" if blocker({}) else "")
        if reason:
            report["benchmarks"][name] = {"skipped": reason}
            print(f"{name}: skipped ({reason})", flush=True)
            continue
        print(f"{name}: running ...", flush=True)
        report["benchmarks"][name] = entry = run_one(name, make_arguments(run), args.timeout)
        print(f"{name}: exit {entry['status']} in {entry['seconds']} s", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out.with_suffix(".json"), report)
    write_text(out.with_suffix(".md"), markdown(report))
    print(f"report: {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0 if all(e.get("status", 0) == 0 for e in report["benchmarks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
