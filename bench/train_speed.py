"""Training throughput of the duplex objective on real tokenized batches, without Ray.

    python -m bench.train_speed --data <workdir>/tokenize-<hash>/train [--steps 6] [--max-tokens 4096]

For each model/loss variant: the mean wall time of one optimizer step (forward and backward of both
directions, AdamW update) over `--steps` steps after one warm-up step, and tokens/s (source + target
tokens, EOS included, as the train stage counts them). Used to size configs/default.yaml for a 2-core CPU.
"""
from __future__ import annotations

import argparse
import json
import time

import pyarrow.parquet as pq
import torch

from pipeline.training.harness import passes, token_batches
from reder import DuplexLoss, LossConfig, ModelConfig, REDER

BASE = dict(vocab_size=8000, d_model=256, n_heads=4, ffn_dim=1024, layers_per_end=3, dropout=0.1, upsample_ratio=2,
            max_positions=1024)
VARIANTS = {
    "d256 L3 ctc-only": ({}, {"aux_start_step": 10**9}),
    "d256 L3 ctc-only, store activations": ({"memory_efficient": False}, {"aux_start_step": 10**9}),
    "d256 L3 ctc+fba+cc": ({}, {}),
    "d256 L3 ctc+fba+cc, store activations": ({"memory_efficient": False}, {}),
    "d256 L2 ctc-only, store activations": ({"memory_efficient": False, "layers_per_end": 2}, {"aux_start_step": 10**9}),
    "d192 L3 ctc-only, store activations": ({"memory_efficient": False, "d_model": 192, "ffn_dim": 768},
                                            {"aux_start_step": 10**9}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="tokenized train split (Parquet directory)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--vocab-size", type=int, default=8000, help="must match the tokenized data")
    parser.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    args = parser.parse_args()
    table = pq.read_table(args.data, columns=["src_ids", "tgt_ids"])
    pairs = list(zip(table.column("src_ids").to_pylist(), table.column("tgt_ids").to_pylist()))
    batches = token_batches([len(s) for s, _ in pairs], [len(t) for _, t in pairs], args.max_tokens, seed=1)
    batches = [[pairs[i] for i in b] for b in batches[: args.steps + 1]]
    names = [n for n in VARIANTS if not args.only or n in args.only.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, max_tokens {args.max_tokens}, "
          f"{args.steps} timed steps")
    rows = []
    for name in names:
        model_overrides, loss_overrides = VARIANTS[name]
        torch.manual_seed(0)
        model = REDER(ModelConfig(**{**BASE, "vocab_size": args.vocab_size, **model_overrides}))
        objective = DuplexLoss(model, LossConfig(**loss_overrides))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        tokens, seconds = 0, 0.0
        for index, batch in enumerate(batches):
            src, src_lengths, tgt, tgt_lengths = passes(batch, torch.device("cpu"))[0]
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            objective(src, src_lengths, tgt, tgt_lengths, 1)["total"].backward()
            optimizer.step()
            if index:  # the first step warms up allocator and kernels
                seconds += time.perf_counter() - started
                tokens += int(src_lengths.sum() + tgt_lengths.sum())
        row = {"variant": name, "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
               "s_per_step": round(seconds / args.steps, 3), "tokens_per_s": round(tokens / seconds, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
