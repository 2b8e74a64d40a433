"""Profile of REDER's update on the CPU (issue 53): host-device sync points, ops, time, top ops by self CPU time.

    python -m bench.train_profile [--code DIR] [--updates 3] [--variant ctc|fba+cc]

A Multi30k-size REDER (configs/multi30k.yaml's model: d512, 4 heads, ffn 1024, 3 layers per end, ratio 2,
vocabulary 10k, dropout 0.3; glancing 0.5) trained by `Harness.update` on random ids: micro-batches of
`--pairs` pairs of 9-15 pieces (+ EOS): 128 is ~4k tokens counted as "sum". `--code DIR` imports reder/ and pipeline/
from another checkout (e.g. a worktree of the commit before issue 53), so that before and after run the same
script; run them interleaved on a shared machine. Prints, per update after one warm-up: the sync points
called from reder/ and pipeline/ (Python-level: item, bool, int, float, tolist, a boolean-mask index, …;
calls inside ATen, such as F.ctc_loss copying CUDA lengths to the host, are not seen), the ATen ops called
from Python (views and allocations left out: about one kernel launch each on a GPU), the wall time without the profiler; then the top ops by
self CPU time; then viterbi_align's ops and time per call, and pad_batch's time per micro-batch.
"""
from __future__ import annotations

import argparse
import collections
import random
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", default=str(Path(__file__).resolve().parents[1]), help="checkout to import")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--variant", choices=("ctc", "fba+cc"), default="ctc")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=128, help="pairs per micro-batch (128: ~4k tokens)")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--time-only", action="store_true", help="syncs and seconds per update only")
    args = parser.parse_args()
    code = Path(args.code).resolve()
    sys.path.insert(0, str(code))
    import torch

    from pipeline.config import TrainConfig
    from pipeline.training.harness import Harness
    from reder import DuplexLoss, LossConfig, ModelConfig, REDER
    from reder.ctc import pad_batch, viterbi_align

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    aux = {"aux_start_step": 0} if args.variant == "fba+cc" else {"aux_start_step": 10**9}
    model = REDER(ModelConfig(vocab_size=10_000, d_model=512, n_heads=4, ffn_dim=1024, layers_per_end=3, dropout=0.3,
                              upsample_ratio=2, max_positions=1024))
    objective = DuplexLoss(model, LossConfig(glance_start=0.5, glance_end=0.5, **aux))
    run = Harness(model, objective, TrainConfig(bf16=False, max_tokens=4096), "cpu")
    rng = random.Random(0)
    ids = lambda: [rng.randint(4, 9_998) for _ in range(rng.randint(9, 15))]  # noqa: E731
    updates = [[[(ids(), ids()) for _ in range(args.pairs)]] for _ in range(args.updates + 1)]
    own = (str(code / "reder") + "/", str(code / "pipeline") + "/")
    run.update(updates[0])  # warm-up: ActNorm's init, allocator

    syncs, seconds = collections.Counter(), []
    for batches in updates[1:]:
        started = time.perf_counter()
        with counted_syncs(own, syncs):  # its wrappers cost microseconds a call: noise beside the update
            result = run.update(batches)
        float(result["total"])  # the update's work is done (on a CPU it always is)
        seconds.append(time.perf_counter() - started)
    print(f"code {code} variant {args.variant} threads {args.threads} pairs {args.pairs}")
    print(f"syncs per update {sum(syncs.values()) / args.updates:.1f}: "
          + ", ".join(f"{kind} {where} ×{n / args.updates:g}" for (kind, where), n in syncs.most_common()))
    print("seconds per update (no profiler) " + " ".join(f"{s:.2f}" for s in seconds))
    if args.time_only:
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run.update(updates[-1])
    events = profile.key_averages()
    ops = launches(profile) * args.updates  # one update profiled
    print(f"ops per update {ops / args.updates:.0f}")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))

    batch, frames, labels = 128, 2 * 16, 16  # a micro-batch of Multi30k: 2 × (15 + EOS) frames, ≤ 16 labels
    log_probs = torch.randn(batch, frames, 10_000).log_softmax(-1)
    lengths = torch.randint(frames // 2, frames + 1, (batch,))
    target_lengths = torch.randint(4, labels // 2 + 1, (batch,))
    targets = torch.randint(4, 9_998, (batch, labels))
    viterbi_align(log_probs, lengths, targets, target_lengths, 9_999)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        viterbi_align(log_probs, lengths, targets, target_lengths, 9_999)
    viterbi_ops = launches(profile)
    started = time.perf_counter()
    for _ in range(20):
        viterbi_align(log_probs, lengths, targets, target_lengths, 9_999)
    per_call = (time.perf_counter() - started) / 20
    sequences = [ids() for _ in range(128)]
    started = time.perf_counter()
    for _ in range(200):
        pad_batch([s + [3] for s in sequences])
    per_batch = (time.perf_counter() - started) / 200
    print(f"viterbi_align (B {batch}, T {frames}, U ≤ {labels // 2}): ops per call {viterbi_ops}, "
          f"ms per call {1000 * per_call:.2f}; pad_batch (128 rows): ms per batch {1000 * per_batch:.3f}")


VIEWS = {"aten::" + name for name in ("select", "slice", "as_strided", "view", "unsqueeze", "squeeze", "expand",
                                      "transpose", "t", "permute", "reshape", "_unsafe_view", "unfold", "alias",
                                      "detach", "empty", "empty_like", "empty_strided", "resize_", "narrow",
                                      "lift_fresh", "result_type", "is_nonzero", "_reshape_alias", "chunk", "split")}


def launches(profile) -> int:
    """The ATen ops called from Python (not from inside another ATen op), views and allocations left out: on a
    GPU, about one kernel launch each."""
    return sum(1 for event in profile.events() if event.name.startswith("aten::") and event.name not in VIEWS
               and (event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::")))


class counted_syncs:
    """Counts the Python-level host-device sync points called from files under `own` (as
    tests/pipeline/test_harness_syncs.py's counter), by (kind, file:line)."""

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "masked_select", "cpu")

    def __init__(self, own: tuple[str, ...], counts: collections.Counter) -> None:
        self.own, self.counts, self.saved = own, counts, []

    def __enter__(self) -> None:
        import torch

        def wrap(name, original, when=None):
            def counted(*args, **kwargs):
                frame = sys._getframe(1)
                if frame.f_code.co_filename.startswith(self.own) and (when is None or when(*args)):
                    where = f"{Path(frame.f_code.co_filename).parent.name}/{Path(frame.f_code.co_filename).name}"
                    self.counts[(name, f"{where}:{frame.f_lineno}")] += 1
                return original(*args, **kwargs)
            return counted

        def mask(tensor, index, *_):
            indices = index if isinstance(index, tuple) else (index,)
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)

        for name in self.NAMES:
            self.saved.append((torch.Tensor, name, getattr(torch.Tensor, name)))
            setattr(torch.Tensor, name, wrap(name, getattr(torch.Tensor, name)))
        for name in ("__getitem__", "__setitem__"):
            self.saved.append((torch.Tensor, name, getattr(torch.Tensor, name)))
            setattr(torch.Tensor, name, wrap("mask index", getattr(torch.Tensor, name), mask))

    def __exit__(self, *exc) -> None:
        for owner, name, original in self.saved:
            setattr(owner, name, original)


if __name__ == "__main__":
    main()
