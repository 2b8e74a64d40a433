"""Tune self-reranking's weight w on the validation split: BLEU of the reranked CTC beam for each w, both ways;
with --penalties, for each blank penalty c of the beam too (a grid of c × w).

    python -m bench.rerank_weight --workdir runs/multi30k [--split valid] [--weights 0 0.25 0.5 1 2 4]
        [--penalties 0 1 2] [--beam 20] [--sentences 0] [--batch 64] [--out DIR]

From the run's `last_run.json`: the train stage's model and the ingested split. Per direction, the beam's
n-best (REDER.nbest, forward scores) and the reverse direction's reconstruction scores
(reder.rerank.reconstruction_scores) are computed once per batch; each w then picks per sentence
(reder.rerank.pick: forward + w · reverse) — exactly what `evaluate.rerank: self` with that
`evaluate.rerank_weight` decodes. Prints one JSON object: sacreBLEU BLEU per direction and w, their mean,
and the best w (highest mean; the smaller w of equals), to put in the config as `evaluate.rerank_weight`.
Without --penalties the beam runs under the model directory's own blank penalty (what evaluate decodes with);
with them every key is `c<penalty>/w<weight>` and `best` names both.
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
    parser.add_argument("--penalties", type=float, nargs="+", default=None,
                        help="the beam's blank penalties to try (default: the model directory's own)")
    parser.add_argument("--beam", type=int, default=20)
    parser.add_argument("--sentences", type=int, default=0, help="the first N of the split (0 = all)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", help="also write each w's hypotheses to OUT/<split>.<direction>.w<w>.txt (c<c>.w<w> with --penalties)")
    args = parser.parse_args(argv)
    if args.beam < 2 or any(w < 0 for w in args.weights):
        raise SystemExit("rerank_weight: --beam must be >= 2 and every weight >= 0")

    import sentencepiece

    from pipeline.stages.evaluate import read_text_split
    from pipeline.metrics import best_setting, corpus_scores
    from reder.checkpoint import SPM_FILE, load_model_dir
    from reder.ctc import pad_batch
    from reder.rerank import pick, reconstruction_scores
    from reder.decoding.ctc import nbest as ctc_nbest
    from reder.decoding.run import encode_lines

    run = json.loads((Path(args.workdir) / "last_run.json").read_text(encoding="utf-8"))
    stages = {name: Path(entry["output"]) for name, entry in run["stages"].items()}
    missing = [name for name in ("ingest", "train") if name not in stages]
    if missing:
        raise SystemExit(f"rerank_weight: {args.workdir} has no finished {missing} stage(s)")
    model_dir = stages["train"] / "model"
    model, _ = load_model_dir(model_dir, args.device)
    if model.cfg.head != "ctc":
        raise SystemExit(f"rerank_weight: {model_dir} has head {model.cfg.head!r}; self-reranking needs a CTC model")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_FILE))
    source, target = read_text_split(stages["ingest"], args.split, args.sentences)
    penalties = args.penalties or [None]  # None: the model's own, per direction
    grid = [(c, w) for c in penalties for w in args.weights]
    name = (lambda c, w: str(w)) if args.penalties is None else (lambda c, w: f"c{c}/w{w}")
    bleu: dict[str, dict[str, float]] = {}
    for direction, inputs, references in (("src2tgt", source, target), ("tgt2src", target, source)):
        encoded = encode_lines(sp, inputs)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        chosen: dict[tuple, list[list[int]]] = {setting: [[] for _ in encoded] for setting in grid}
        with torch.inference_mode():
            for start in range(0, len(order), args.batch):
                rows = order[start : start + args.batch]
                tokens, lengths = pad_batch([encoded[i] for i in rows], args.device)
                for penalty in penalties:
                    nbest = ctc_nbest(model, tokens, lengths, direction, args.beam, blank_penalty=penalty)
                    reverse = reconstruction_scores(model, tokens, lengths, direction,
                                                    [[ids for ids, _ in e] for e in nbest])
                    for weight in args.weights:
                        for row, entries, scores in zip(rows, nbest, reverse):
                            chosen[penalty, weight][row] = pick(entries, scores, weight)
        texts = {setting: [sp.decode(h) for h in chosen[setting]] for setting in grid}
        bleu[direction] = {name(*s): round(corpus_scores(texts[s], references)["bleu"], 2) for s in grid}
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            for setting, lines in texts.items():
                label = f"w{setting[1]}" if args.penalties is None else name(*setting).replace("/", ".")
                (Path(args.out) / f"{args.split}.{direction}.{label}.txt").write_text(
                    "".join(t + "\n" for t in lines), encoding="utf-8")
    mean = {name(*s): round(sum(bleu[d][name(*s)] for d in bleu) / len(bleu), 2) for s in grid}
    report = {"benchmark": "rerank_weight", "workdir": str(Path(args.workdir).resolve()), "split": args.split,
              "sentences": len(source), "beam": args.beam, "bleu": bleu, "mean_bleu": mean}
    if args.penalties is None:
        best = best_setting({w: mean[str(w)] for w in args.weights})
        report.update(best_weight=best, config=f"evaluate.rerank=self evaluate.rerank_weight={best}")
    else:
        report["best"] = max(grid, key=lambda s: (mean[name(*s)], -abs(s[0]), -abs(s[1])))
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
