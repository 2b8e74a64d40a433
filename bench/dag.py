"""DAG head: the DP loss with its hand-written backward vs plain autograd, and the decoders' speed.

    python -m bench.dag [--grid 8,16,64 8,32,128 8,64,256] [--device cpu|cuda] [--repeats 5]
                        [--decode-lengths 64 128 256] [--decode-batch 16]

Prints one JSON object. For each (B, M, L) — batch, target tokens, graph vertices; float32, every graph
full length — the loss's forward + backward runs in its own subprocess, once with the hand-written
backward (`dag_log_likelihood`) and once through plain autograd (`hand_written=False`, the same DP), and
reports:
- `saved_mb`: what autograd keeps for backward beyond the two inputs (log E and the emissions), counted
  with `torch.autograd.graph.saved_tensors_hooks` (storages deduplicated);
- `peak_mb`: on CPU the peak RSS during forward + backward minus the RSS before it (glibc's mmap threshold
  pinned and VmHWM reset, as bench/memory.py does); on CUDA torch.cuda.max_memory_allocated minus the
  memory allocated before it. It includes the gradient buffers, which both variants need;
- `step_s`: the median wall time of forward + backward (torch's default threads: set OMP_NUM_THREADS),
  from a second subprocess with glibc's default malloc settings (the pinned mmap threshold of the memory
  run turns every freed (B, L, L) temporary into an munmap and page faults, which slows the
  hand-written passes, which allocate per step, far more than autograd).
Decoding: ms per sentence of greedy, lookahead and Viterbi on random graphs of each length (batch
`--decode-batch`, vocabulary 1000).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench.peak import PINNED_MALLOC, time_and_peak

VOCAB = 1000


def _inputs(batch: int, steps: int, length: int, device: str):
    import torch

    from reder.dag import edge_mask, masked_log_softmax

    graph_lengths = torch.full((batch,), length, device=device)
    target_lengths = torch.full((batch,), steps, device=device)
    scores = torch.randn(batch, length, length, device=device)
    log_edges = masked_log_softmax(scores, edge_mask(graph_lengths, length), dim=-1)
    emissions = torch.randn(batch, steps, length, device=device).log_softmax(-1)
    return log_edges, emissions, graph_lengths, target_lengths


def measure(batch: int, steps: int, length: int, hand_written: bool, device: str, repeats: int) -> dict:
    """One configuration, in this process."""
    import torch

    from reder.dag import dag_log_likelihood

    torch.manual_seed(0)
    log_edges, emissions, graph_lengths, target_lengths = _inputs(batch, steps, length, device)
    log_edges, emissions = log_edges.requires_grad_(), emissions.requires_grad_()
    inputs = {log_edges.untyped_storage().data_ptr(), emissions.untyped_storage().data_ptr()}

    def step() -> None:
        log_edges.grad = emissions.grad = None
        (-dag_log_likelihood(log_edges, emissions, graph_lengths, target_lengths, hand_written).sum()).backward()

    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in inputs:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()  # warm-up, and the saved-tensor count

    def reset() -> None:
        log_edges.grad = emissions.grad = None

    times, peaks = time_and_peak(step, repeats, device, reset)
    return {"batch": batch, "target_tokens": steps, "graph_vertices": length,
            "backward": "hand-written" if hand_written else "autograd", "saved_mb": round(sum(saved.values()) / 2**20, 3),
            "peak_mb": round(max(peaks), 1), "step_s": round(statistics.median(times), 4)}


def decode_times(lengths: list[int], batch: int, device: str, repeats: int) -> list[dict]:
    """ms per sentence of each decoder on random graphs of each length."""
    import torch

    from reder.dag import DAG_DECODERS, dag_decode

    rows = []
    for length in lengths:
        torch.manual_seed(0)
        log_edges, _, graph_lengths, _ = _inputs(batch, 2, length, device)
        log_probs = torch.randn(batch, length, VOCAB, device=device).log_softmax(-1)
        row = {"graph_vertices": length, "batch": batch}
        for decoder in DAG_DECODERS:
            dag_decode(decoder, log_edges, log_probs, graph_lengths)  # warm-up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                dag_decode(decoder, log_edges, log_probs, graph_lengths)
                times.append(time.perf_counter() - start)
            row[f"{decoder}_ms_per_sentence"] = round(1000 * statistics.median(times) / batch, 3)
        rows.append(row)
    return rows


def _run_child(batch: int, steps: int, length: int, hand_written: bool, args: argparse.Namespace) -> dict:
    """Memory from a child with malloc pinned (real peaks), time from a child with default malloc."""
    command = [sys.executable, "-m", "bench.dag", "--child", str(batch), str(steps), str(length), str(int(hand_written)),
               "--device", args.device, "--repeats", str(args.repeats)]
    rows = []
    for env in (dict(os.environ, **PINNED_MALLOC), dict(os.environ)):
        out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {**rows[0], "step_s": rows[1]["step_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", nargs="+", default=["8,16,64", "8,32,128", "8,64,256"], help="B,M,L triples")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decode-lengths", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--decode-batch", type=int, default=16)
    parser.add_argument("--child", nargs=4, metavar=("B", "M", "L", "HAND_WRITTEN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        batch, steps, length, hand_written = (int(value) for value in args.child)
        print(json.dumps(measure(batch, steps, length, bool(hand_written), args.device, args.repeats)))
        return
    rows, summary = [], {}
    for triple in args.grid:
        batch, steps, length = (int(value) for value in triple.split(","))
        pair = {}
        for hand_written in (True, False):
            pair[hand_written] = _run_child(batch, steps, length, hand_written, args)
            rows.append(pair[hand_written])
            print(json.dumps(pair[hand_written]), file=sys.stderr)
        summary[f"B{batch}_M{steps}_L{length}"] = {
            f"{key}_ratio": round(pair[True][key] / pair[False][key], 4) if pair[False][key] > 0 else None
            for key in ("saved_mb", "peak_mb", "step_s")}
    import torch

    setup = {"dtype": "float32", "device": args.device, "torch": torch.__version__, "threads": torch.get_num_threads(),
             "repeats": args.repeats, "vocab_for_decoding": VOCAB}
    decoding = decode_times(args.decode_lengths, args.decode_batch, args.device, args.repeats)
    print(json.dumps({"setup": setup, "loss": rows, "decoding": decoding,
                      "summary": {"hand_written_over_autograd": summary}}, indent=1))


if __name__ == "__main__":
    main()
