"""The int8 option's cost in output (issue 58, item 5): a small REDER trained here on CPU on Multi30k pairs, then
decoded greedy both ways through the float32 inference path and through `reder.runtime.onednn.quantized` (the trunk's
linear layers int8): BLEU of each against the references, the share of sentences whose tokens are identical, and
the batch-1 / batch-N speed of both in the same process.

    python -m bench.int8_quality [--pairs 64] [--limit-s 240] [--threads 1] [--d-model 128] [--out FILE]

The model memorises `--pairs` Multi30k train pairs (whitespace words; by default d128, 4 heads, FFN 256, 2 layers per end,
r = 3: the learning test's model) until both directions' greedy BLEU exceeds 90 or `--limit-s` runs out, then
is scored on the same pairs: a trained, confident model on inputs it knows, not a held-out test set.

    python -m bench.int8_quality --model MODEL_DIR [--test PREFIX] [--threads 1] [--out FILE]

scores a model the pipeline trained (its train stage's `model/`, or an MLflow `models:/` URI) on held-out pairs
instead (`--test`: PREFIX.<src_lang> and PREFIX.<tgt_lang>, default Multi30k's test 2016), both ways, greedy,
through `reder.load(MODEL_DIR)` and `reder.load(MODEL_DIR, int8=True)`: sacreBLEU of each, the share of identical
outputs, and the sentences/s of both at batch 64 (`--repeats`, interleaved).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import sacrebleu
import torch

from bench import MULTI30K, emit


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--limit-s", type=float, default=240.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--d-model", type=int, default=128, help="FFN 2x, heads d_model / 32")
    parser.add_argument("--model", help="a trained model directory: score it on --test instead of training one")
    parser.add_argument("--test", default=str(MULTI30K / "test_2016_flickr"), help="held-out pairs: PREFIX.<lang>")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model:
        return emit(held_out(args), args.out)
    torch.manual_seed(0)
    from reder import EOS_ID, DuplexLoss, LossConfig, ModelConfig, REDER
    from reder.ctc import pad_batch
    from reder.decoding.run import decode
    from reder.runtime.onednn import quantized

    english = (MULTI30K / "train.en").read_text(encoding="utf-8").splitlines()[: args.pairs]
    german = (MULTI30K / "train.de").read_text(encoding="utf-8").splitlines()[: args.pairs]
    vocab = {w: i + 4 for i, w in enumerate(sorted({w for line in english + german for w in line.split()}))}
    words = {i: w for w, i in vocab.items()}
    encode = lambda lines: pad_batch([[vocab[w] for w in line.split()] + [EOS_ID] for line in lines])  # noqa: E731
    src, src_lengths = encode(english)
    tgt, tgt_lengths = encode(german)
    cfg = ModelConfig(vocab_size=len(vocab) + 5, d_model=args.d_model, n_heads=max(1, args.d_model // 32),
                      ffn_dim=2 * args.d_model, layers_per_end=2, dropout=0.0, upsample_ratio=3, max_relative_distance=8,
                      label_smoothing=0.0)
    model = REDER(cfg).train()
    objective = DuplexLoss(model, LossConfig(lambda_fba=0.0, lambda_cc=0.0))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98))
    inputs = {"src2tgt": (src, src_lengths, german), "tgt2src": (tgt, tgt_lengths, english)}

    def scores(chosen: REDER) -> dict[str, tuple[float, list[list[int]]]]:
        out = {}
        for direction, (tokens, lengths, references) in inputs.items():
            with torch.inference_mode():
                hypotheses = decode(chosen, tokens, lengths, direction)
            text = [" ".join(words.get(t, "<unk>") for t in h) for h in hypotheses]
            out[direction] = (sacrebleu.corpus_bleu(text, [references]).score, hypotheses)
        return out

    start, step = time.monotonic(), 0
    while time.monotonic() - start < args.limit_s:
        terms = objective(src, src_lengths, tgt, tgt_lengths, step)
        optimizer.zero_grad()
        terms["total"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % 25 == 0:
            model.eval()
            done = min(bleu for bleu, _ in scores(model).values()) > 90
            model.train()
            if done:
                break
    train_s = time.monotonic() - start
    model.eval()
    int8 = quantized(model)
    float_scores, int8_scores = scores(model), scores(int8)
    report = {"benchmark": "int8_quality", "pairs": args.pairs, "d_model": args.d_model, "updates": step,
              "train_s": round(train_s, 1),
              "threads": args.threads, "load_before": [round(x, 2) for x in os.getloadavg()], "directions": {}}
    for direction in inputs:
        (bleu32, hyp32), (bleu8, hyp8) = float_scores[direction], int8_scores[direction]
        report["directions"][direction] = {"bleu_float32": round(bleu32, 2), "bleu_int8": round(bleu8, 2),
                                           "identical_share": round(sum(a == b for a, b in zip(hyp32, hyp8)) / len(hyp32), 3)}
    with torch.inference_mode():
        report["sentences_per_s"] = interleaved_rates(
            {name: (lambda chosen=chosen: decode(chosen, src, src_lengths, "src2tgt"))
             for name, chosen in (("float32", model), ("int8", int8))}, len(english), args.repeats)
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return emit(report, args.out)


def held_out(args: argparse.Namespace) -> dict:
    """A trained model directory's float32 and int8 greedy output on held-out pairs, both ways."""
    from reder import load

    chosen = {"float32": load(args.model), "int8": load(args.model, int8=True)}
    languages = chosen["float32"].languages
    lines = {lang: Path(f"{args.test}.{lang}").read_text(encoding="utf-8").splitlines() for lang in languages}
    report = {"benchmark": "int8_quality", "model": args.model, "test": args.test, "sentences": len(lines[languages[0]]),
              "threads": args.threads, "load_before": [round(x, 2) for x in os.getloadavg()], "directions": {}}
    for direction, (src, tgt) in (("src2tgt", languages), ("tgt2src", languages[::-1])):
        outputs = {name: translator.translate(lines[src], src, tgt) for name, translator in chosen.items()}
        report["directions"][direction] = {
            **{f"bleu_{name}": round(sacrebleu.corpus_bleu(out, [lines[tgt]]).score, 2) for name, out in outputs.items()},
            "identical_share": round(sum(a == b for a, b in zip(*outputs.values())) / len(lines[src]), 3)}
    report["sentences_per_s_batch64"] = interleaved_rates(
        {name: (lambda translator=translator: translator.translate(lines[languages[0]], *languages))
         for name, translator in chosen.items()}, len(lines[languages[0]]), args.repeats)
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return report


def interleaved_rates(calls: dict[str, Callable[[], Any]], count: int, repeats: int) -> dict[str, float]:
    """Each call's median rate (`count` items per second) over `repeats` rounds, the calls interleaved in each
    round so that a change of the machine's load hits them all."""
    rates: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            rates[name].append(count / (time.perf_counter() - started))
    return {name: round(statistics.median(values), 1) for name, values in rates.items()}


if __name__ == "__main__":
    main()
