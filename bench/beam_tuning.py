"""The evaluate stage's beam tuning (each beam decoder's blank penalty chosen on validation), timed two ways on a
finished pipeline workdir's model: every decoder and grid point decoded on its own (`translate_ids` per point and
decoder, as the stage did before) against one n-best per point shared by the decoders
(`reder.translate.reranked_by_penalty`, as it does now). Both outputs are checked equal.

    python -m bench.beam_tuning --workdir W [--split valid] [--sentences 200] [--beam 20] [--weight 1]
        [--penalties 0 0.5 1 1.5 2 2.5 3] [--batch 64] [--threads 1] [--out FILE.json]

Prints wall and CPU seconds per direction and way, and the ratio. With one thread the CPU time is what a quiet
machine's wall time would be (the 2-core box is shared).
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

DEFAULT_PENALTIES = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a pipeline workdir with finished ingest and train stages")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--sentences", type=int, default=200, help="the split's first N sentences (0: all)")
    parser.add_argument("--beam", type=int, default=20)
    parser.add_argument("--weight", type=float, default=1.0, help="self-reranking's weight")
    parser.add_argument("--penalties", type=float, nargs="+", default=list(DEFAULT_PENALTIES))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="also write the numbers as JSON here")
    args = parser.parse_args(argv)

    import sentencepiece
    import torch

    from pipeline.stages.evaluate import read_text_split
    from reder.checkpoint import SPM_FILE, load_model_dir
    from reder.decoding import make_decoder
    from reder.decoding.ctc import reranked_by_penalty
    from reder.decoding.run import encode_lines, translate_ids

    torch.set_num_threads(args.threads)
    run = json.loads((Path(args.workdir) / "last_run.json").read_text(encoding="utf-8"))
    stages = {name: Path(entry["output"]) for name, entry in run["stages"].items()}
    model_dir = stages["train"] / "model"
    model, _ = load_model_dir(model_dir, "cpu")
    if model.cfg.head != "ctc":
        raise SystemExit(f"beam_tuning: {model_dir} has head {model.cfg.head!r}; the beam tuning is for CTC models")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_FILE))
    source, target = read_text_split(stages["ingest"], args.split, args.sentences)
    rerankers = {f"beam{args.beam}": make_decoder(model, "beam", beam_size=args.beam),
                 f"beam{args.beam}_selfrerank": make_decoder(model, "beam", beam_size=args.beam, rerank="self",
                                                             rerank_weight=args.weight)}

    def timed(work):
        wall, cpu = time.perf_counter(), time.process_time()
        result = work()
        return result, round(time.perf_counter() - wall, 2), round(time.process_time() - cpu, 2)

    rows = []
    for direction, inputs in (("src2tgt", source), ("tgt2src", target)):
        encoded = encode_lines(sp, inputs)
        apart, apart_wall, apart_cpu = timed(lambda: {
            penalty: {name: translate_ids(model, encoded, direction, replace(decoder, blank_penalty=penalty), args.batch)
                      for name, decoder in rerankers.items()} for penalty in args.penalties})
        shared, shared_wall, shared_cpu = timed(lambda: reranked_by_penalty(
            model, encoded, direction, args.penalties, rerankers, args.batch))
        if shared != {float(p): outputs for p, outputs in apart.items()}:
            raise SystemExit(f"beam_tuning: {direction}: the shared n-best's outputs differ from translate_ids'")
        rows.append({"direction": direction, "sentences": len(encoded), "points": len(args.penalties),
                     "decoders": list(rerankers), "apart_wall_s": apart_wall, "apart_cpu_s": apart_cpu,
                     "shared_wall_s": shared_wall, "shared_cpu_s": shared_cpu,
                     "cpu_ratio": round(apart_cpu / max(shared_cpu, 1e-9), 2)})
        print(f"{direction}: {len(encoded)} sentences x {len(args.penalties)} penalties x {len(rerankers)} decoders, "
              f"beam {args.beam}: apart {apart_cpu:.1f} CPU s ({apart_wall:.1f} s), shared {shared_cpu:.1f} CPU s "
              f"({shared_wall:.1f} s): {rows[-1]['cpu_ratio']}x, outputs equal")
    report = {"workdir": str(args.workdir), "model": str(model_dir), "split": args.split, "beam": args.beam,
              "threads": args.threads, "penalties": args.penalties, "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
