"""CTC prefix beam search speed, old against new, same model and inputs, one process (issue 26).

    python -m bench.ctc_beam [--sentences 128] [--batch 64] [--beam 20] [--repeats 3] [--threads 2]

A random-initialised REDER of the configs/multi30k.yaml shape (vocabulary 10,000, d_model 512, 3 layers per
end, upsample ratio 2), fed random pieces with the lengths of the first `--sentences` English sentences of
Multi30k test 2016 (words + 1 for EOS). Its outputs are nearly flat, the search's worst case. Old: the
per-sentence Python prefix search over each frame's top-`beam` tokens (tests/reder/test_decode.py's
reference, as reder/decode.py had it) with per-sentence rescoring; new: reder.decode.ctc_nbest (batched
tensor search, batched rescoring) at cutoff_top_n = beam (the same search) and at the default cutoff.
Runs are interleaved (old, new, old, new, ...) and timed on the search alone (log-probs precomputed) and end
to end (with the model's forward pass); prints one JSON object with sentences/s and the new/old ratios.
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from bench import MULTI30K
from reder import REDER, ModelConfig
from reder.ctc import pad_batch
from reder.decode import CUTOFF_TOP_N, ctc_greedy, ctc_nbest, ctc_scores
from tests.reder.test_decode import reference_prefix_search


def old_nbest(log_probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_size: int) -> list[list[list[int]]]:
    """The pre-issue-26 ctc_nbest: per sentence, Python prefix search over the top-beam tokens, then rescoring."""
    top_log_probs, top_tokens = log_probs.float().topk(min(beam_size, log_probs.shape[-1]), dim=-1)
    greedy = ctc_greedy(log_probs, lengths, blank)
    results = []
    for index, length in enumerate(lengths.tolist()):
        frames = [list(zip(t, v)) for t, v in zip(top_tokens[index, :length].tolist(), top_log_probs[index, :length].tolist())]
        pool = [list(p) for p in dict.fromkeys([*reference_prefix_search(frames, blank, beam_size), tuple(greedy[index])])]
        scores = ctc_scores(log_probs[index], length, pool, blank)
        results.append([pool[i] for i in sorted(range(len(pool)), key=lambda i: -scores[i])[:beam_size]])
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--beam", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=10000, d_model=512, n_heads=8, ffn_dim=2048, layers_per_end=3, upsample_ratio=2)
    model = REDER(cfg).eval()
    lines = (MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[: args.sentences]
    sequences = [torch.randint(4, cfg.vocab_size - 1, (len(line.split()),)).tolist() + [3] for line in lines]
    batches = [pad_batch(sequences[i : i + args.batch]) for i in range(0, len(sequences), args.batch)]
    with torch.no_grad():
        outputs = [model(tokens, lengths, "src2tgt") for tokens, lengths in batches]
    blank = cfg.blank_id
    searches = {"old": lambda lp, n: old_nbest(lp, n, blank, args.beam),
                "new_same_cutoff": lambda lp, n: ctc_nbest(lp, n, blank, args.beam, cutoff_top_n=args.beam),
                f"new_cutoff_{CUTOFF_TOP_N}": lambda lp, n: ctc_nbest(lp, n, blank, args.beam)}
    seconds = {f"{name}_{part}": 0.0 for name in searches for part in ("search", "end_to_end")}
    for _ in range(args.repeats):
        for name, search in searches.items():  # interleaved: the machine's load hits all alike
            for (tokens, lengths), (log_probs, out_lengths) in zip(batches, outputs):
                started = time.perf_counter()
                search(log_probs, out_lengths)
                seconds[f"{name}_search"] += time.perf_counter() - started
                started = time.perf_counter()
                with torch.no_grad():
                    search(*model(tokens, lengths, "src2tgt"))
                seconds[f"{name}_end_to_end"] += time.perf_counter() - started
    rate = {key: round(args.repeats * len(sequences) / value, 1) for key, value in seconds.items()}
    report = {"benchmark": "ctc_beam", "machine": platform.platform(), "threads": torch.get_num_threads(),
              "sentences": len(sequences), "batch": args.batch, "beam": args.beam, "repeats": args.repeats,
              "mean_source_pieces": round(sum(map(len, sequences)) / len(sequences), 2),
              "sentences_per_s": rate,
              "ratio_vs_old": {key: round(value / rate[f"old_{key.rsplit('_', 1)[-1] if key.endswith('search') else 'end_to_end'}"], 2)
                               for key, value in rate.items() if not key.startswith("old")}}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
