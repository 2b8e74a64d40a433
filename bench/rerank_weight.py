"""Tune self-reranking's weight w on the validation split: BLEU of the reranked CTC beam for each w, both ways.

    python -m bench.rerank_weight --workdir runs/multi30k [--split valid] [--weights 0 0.25 0.5 1 2 4]
        [--beam 20] [--sentences 0] [--batch 64] [--out DIR]

From the run's `last_run.json`: the train stage's model and the ingested split. Per direction, the beam's
n-best (REDER.nbest, forward scores) and the reverse direction's reconstruction scores
(reder.rerank.reconstruction_scores) are computed once per batch; each w then picks per sentence
(reder.rerank.pick: forward + w · reverse) — exactly what `evaluate.rerank: self` with that
`evaluate.rerank_weight` decodes. Prints one JSON object: sacreBLEU BLEU per direction and w, their mean,
and the best w (highest mean; the smaller w of equals), to put in the config as `evaluate.rerank_weight`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="a finished pipeline run with ingest and train stages")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--weights", type=float, nargs="+", default=[0.0, 0.25, 0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--beam", type=int, default=20)
    parser.add_argument("--sentences", type=int, default=0, help="the first N of the split (0 = all)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", help="also write each w's hypotheses to OUT/<split>.<direction>.w<w>.txt")
    args = parser.parse_args(argv)
    if args.beam < 2 or any(w < 0 for w in args.weights):
        raise SystemExit("rerank_weight: --beam must be >= 2 and every weight >= 0")

    import sentencepiece

    from pipeline.evaluate import read_text_split
    from pipeline.metrics import best_setting, corpus_scores
    from reder.checkpoint import SPM_FILE, load_model_dir
    from reder.ctc import pad_batch
    from reder.rerank import pick, reconstruction_scores
    from reder.translate import encode_lines

    run = json.loads((Path(args.workdir) / "last_run.json").read_text(encoding="utf-8"))
    stages = {name: Path(entry["output"]) for name, entry in run["stages"].items()}
    missing = [name for name in ("ingest", "train") if name not in stages]
    if missing:
        raise SystemExit(f"rerank_weight: {args.workdir} has no finished {missing} stage(s)")
    model_dir = stages["train"] / "model"
    model, _ = load_model_dir(model_dir, args.device)
    if not model.head.reranks:
        raise SystemExit(f"rerank_weight: {model_dir} has head {model.cfg.head!r}; self-reranking needs a CTC model")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_FILE))
    source, target = read_text_split(stages["ingest"], args.split, args.sentences)
    bleu: dict[str, dict[str, float]] = {}
    for direction, inputs, references in (("src2tgt", source, target), ("tgt2src", target, source)):
        encoded = encode_lines(sp, inputs)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        chosen: dict[float, list[list[int]]] = {w: [[] for _ in encoded] for w in args.weights}
        with torch.inference_mode():
            for start in range(0, len(order), args.batch):
                rows = order[start : start + args.batch]
                tokens, lengths = pad_batch([encoded[i] for i in rows], args.device)
                nbest = model.nbest(tokens, lengths, direction, args.beam)
                reverse = reconstruction_scores(model, tokens, lengths, direction, [[ids for ids, _ in e] for e in nbest])
                for weight in args.weights:
                    for row, entries, scores in zip(rows, nbest, reverse):
                        chosen[weight][row] = pick(entries, scores, weight)
        texts = {w: [sp.decode(h) for h in chosen[w]] for w in args.weights}
        bleu[direction] = {str(w): round(corpus_scores(texts[w], references)["bleu"], 2) for w in args.weights}
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            for w, lines in texts.items():
                (Path(args.out) / f"{args.split}.{direction}.w{w}.txt").write_text("".join(t + "\n" for t in lines),
                                                                                encoding="utf-8")
    mean = {str(w): round(sum(bleu[d][str(w)] for d in bleu) / len(bleu), 2) for w in args.weights}
    best = best_setting({w: mean[str(w)] for w in args.weights})
    report = {"benchmark": "rerank_weight", "workdir": str(Path(args.workdir).resolve()), "split": args.split,
              "sentences": len(source), "beam": args.beam, "bleu": bleu, "mean_bleu": mean, "best_weight": best,
              "config": f"evaluate.rerank=self evaluate.rerank_weight={best}"}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
