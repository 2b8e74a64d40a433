"""Training throughput through the real train stage (Ray Train, DDP) with 1 and 2 workers on the same CPUs.

    python -m bench.train_scaling [--config configs/default.yaml] [--steps 40] [--workdir runs/bench-scaling]

Runs the data stages once (reused when finished), then the train stage with each worker layout in
`--layouts` (workers x CPUs per worker; default 1x1, 2x1 and 1x2: one worker on one core; two DDP workers
on one core each, gloo all-reduce between them — the scaling from 1 to 2 workers; and the same two cores
as one worker with two threads — what DDP costs against threading on one machine). Each worker takes
`train.max_tokens` per micro-batch, so two workers process twice the tokens per update (weak scaling, as
with more GPUs). Reports, from the stage's own per-window metrics (all-reduced tokens over wall time,
the first window dropped as warm-up): tokens/s in all, tokens/s per worker, the stage's wall time, and the
speed-up of each layout over the first.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench import REPO_ROOT


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO_ROOT / "configs" / "default.yaml"))
    parser.add_argument("--steps", type=int, default=40, help="updates per layout")
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--layouts", nargs="+", default=["1x1", "2x1", "1x2"], help="WORKERSxCPUS_PER_WORKER")
    parser.add_argument("--workdir", default=str(REPO_ROOT / "runs" / "bench-scaling"))
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO_ROOT))
    import run_pipeline
    from pipeline.config import load_config

    base = [f"workdir={Path(args.workdir).resolve()}", "tracking.enabled=false", *args.overrides]
    cfg = load_config(args.config, base)
    run_pipeline.run(cfg, ["ingest", "spm", "tokenize"])
    rows = []
    for layout in args.layouts:
        workers, cpus = layout.split("x")
        cfg = load_config(args.config, base + [
            f"train.num_workers={workers}", f"train.cpus_per_worker={cpus}", f"train.max_steps={args.steps}",
            f"train.log_every={args.log_every}", f"train.validate_every={args.steps}", "train.valid_max_sentences=16",
            "train.keep_checkpoints=1", "train.average_best=1", f"loss.aux_start_step={args.steps + 1}"])
        started = time.time()
        summary = run_pipeline.run(cfg, ["train"], force=True)
        seconds = time.time() - started
        history = json.loads((Path(summary["train"]["output"]) / "history.json").read_text(encoding="utf-8"))
        windows = [h for h in history if "tokens_per_s" in h][1:]  # the first window holds start-up costs
        tokens_per_s = statistics.mean(h["tokens_per_s"] for h in windows)
        rows.append({"layout": layout, "workers": int(workers), "cpus_per_worker": float(cpus),
                     "tokens_per_s": round(tokens_per_s, 1),
                     "tokens_per_s_per_worker": round(tokens_per_s / int(workers), 1),
                     "stage_seconds": round(seconds, 1)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    for row in rows:
        row["speedup_vs_first"] = round(row["tokens_per_s"] / rows[0]["tokens_per_s"], 2)
    result = {"config": args.config, "steps": args.steps, "max_tokens_per_worker": cfg.train.max_tokens,
              "model": {k: getattr(cfg.model, k) for k in ("d_model", "layers_per_end", "vocab_size")},
              "summary": rows}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
