"""Decoding speed of a finished pipeline run: REDER's decoders against the AR teacher's, same test
sentences, same machine, same process.

    python -m bench.decode_speed --workdir runs/multi30k [--sentences 200] [--beam 20] [--batch 64]

Prints one JSON object. From the run's `last_run.json`: the train stage's model, the teacher stage's
teachers and the ingested test split (src2tgt). Decoders: REDER greedy and CTC prefix beam `--beam`
(with teacher reranking, `beam<K>_rerank`) — or a DAG model's greedy, lookahead and Viterbi — and the
teacher's greedy and beam 4 (`pipeline.stages.evaluate.decoders_for`). For each: latency per sentence at batch 1
(mean and p90 over `--sentences`, one at a time after a warm-up) and sentences/s at batch `--batch` over
the same sentences (`pipeline.stages.evaluate.measure_speed`), then every REDER decoder's speed-up over every
teacher decoder at batch 1 and at batch `--batch`.
"""
from __future__ import annotations

import argparse
import json
import platform
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import torch


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="a finished pipeline run with train and teacher stages")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--beam", type=int, default=20, help="REDER's CTC prefix beam (1 = greedy only)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    from pipeline.stages import evaluate, teacher
    from pipeline.config import PipelineConfig, from_dict
    from reder.checkpoint import SPM_FILE, load_model_dir
    from reder.decoding.run import encode_lines

    run = json.loads((Path(args.workdir) / "last_run.json").read_text(encoding="utf-8"))
    stages = {name: Path(entry["output"]) for name, entry in run["stages"].items()}
    missing = [name for name in ("ingest", "teacher", "train") if name not in stages]
    if missing:
        raise SystemExit(f"decode_speed: {args.workdir} has no finished {missing} stage(s)")
    cfg = from_dict(PipelineConfig, run["config"])
    model_dir = stages["train"] / "model"
    model, _ = load_model_dir(model_dir, args.device)
    teachers = {d: teacher.check_teacher(p, d, cfg, model_dir / SPM_FILE).to(args.device)
                for d, p in teacher.model_dirs(stages["teacher"]).items()}
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_FILE))
    source, _ = evaluate.read_text_split(stages["ingest"], "test", args.sentences)
    encoded = encode_lines(sp, source)
    options = SimpleNamespace(**{**asdict(cfg.evaluate), "beam_size": args.beam, "teacher_baseline": True,
                                 "rerank": "teacher" if model.cfg.head == "ctc" and args.beam > 1 else "none",
                                 "teacher_beam_size": 4, "latency_sentences": len(encoded), "throughput_batch": args.batch})
    decoders = evaluate.decoders_for(model, options, teachers)
    speed = evaluate.measure_speed(model, encoded, decoders, options)
    report = {"benchmark": "decode_speed", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": platform.platform(), "device": args.device, "threads": torch.get_num_threads(),
              "workdir": str(Path(args.workdir).resolve()), "sentences": len(encoded),
              "mean_source_pieces": round(sum(map(len, encoded)) / max(1, len(encoded)), 2),
              "reder_parameters": sum(p.numel() for p in model.parameters()),
              "teacher_parameters": sum(p.numel() for p in teachers["src2tgt"].parameters()), "speed": speed,
              "summary": [{"decoder": name, "latency_ms": speed.get(f"{name}_latency_ms"),
                           "sentences_per_s": speed[f"{name}_sentences_per_s"],
                           "speedup_vs_teacher_beam4_batch1": speed.get(f"speedup_{name}_vs_teacher_beam4_batch1")}
                          for name in decoders]}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
