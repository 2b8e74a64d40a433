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

    python -m bench.dag --triton [--device cpu|cuda] [--ratios 2 4 8] [--token-grid 64,24 ...]
                        [--max-blocks 64] [--update-grid 128,24] [--repeats 5]

the Triton DP (reder/dag_triton.py) instead, at the same token batch as a CTC update: B sentences of
S input tokens (BOS and EOS included) and S target tokens, vocabulary 1000; the DAG graph has int(λ·S)
vertices, CTC (r = 2) 2·S frames. Per λ, batch and tile bound (`--max-blocks`, the kernels' MAX_BLOCK):
forward + backward of the DAG loss (`dag_loss`: the emissions' gather and the DP) with model.dag_dp=torch
and =triton, and of the CTC loss (`ctc_loss`) on the CTC head's log-probs; the largest differences
between the two DAG losses and their gradients; median seconds (`step_s`; `first_s`, the first call,
includes Triton's compilation) and on CUDA the peak memory above the inputs (`peak_mb`). With
`--update-grid`: whole REDER updates (both directions, AdamW; multi30k.yaml's model, no FBA/CC) with the CTC
head and with the DAG head under each DP, and the DAG/CTC ratios — the target is ≤ 1.5 at λ = 4 on
the H100. On CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here): their differences
are checked, their times are NumPy's, and no speed claim is made (`speed_claim`: false).
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
    """ms per sentence of each decoder on random graphs of each length (the beams of size 4: exact strings and paths)."""
    import torch

    from types import SimpleNamespace

    from reder.decoding.dag import DagBeam, DagGreedy, DagLookahead, DagPathBeam, DagViterbi
    from reder.heads import HeadOutput

    rows = []
    for length in lengths:
        torch.manual_seed(0)
        log_edges, _, graph_lengths, _ = _inputs(batch, 2, length, device)
        log_probs = torch.randn(batch, length, VOCAB, device=device).log_softmax(-1)
        row = {"graph_vertices": length, "batch": batch}
        output = HeadOutput(log_probs, graph_lengths, {"log_edges": log_edges})
        model = SimpleNamespace(cfg=SimpleNamespace(blank_id=VOCAB - 1))  # what the beams read of a model
        for decoder in (DagGreedy(), DagLookahead(), DagViterbi(), DagBeam(beam_size=4), DagPathBeam(beam_size=4)):
            name = decoder.name + ("4" if "beam" in decoder.name else "")
            decoder.search(model, output)  # warm-up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                decoder.search(model, output)
                times.append(time.perf_counter() - start)
            row[f"{name}_ms_per_sentence"] = round(1000 * statistics.median(times) / batch, 3)
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


def _token_batch(batch: int, source: int, ratio: float, device: str):
    """One token batch as each head's loss sees it: DAG log E (B, L, L) and log-probs (B, L, V) over
    L = int(λ·S) vertices, CTC log-probs (B, 2S, V), targets (B, S) and the lengths."""
    import torch

    from reder.dag import edge_mask, graph_lengths_for, masked_log_softmax

    graph_lengths = graph_lengths_for(torch.full((batch,), source), ratio).to(device)
    length = int(graph_lengths.max())
    log_edges = masked_log_softmax(torch.randn(batch, length, length, device=device), edge_mask(graph_lengths, length), dim=-1)
    dag_log_probs = torch.randn(batch, length, VOCAB, device=device).log_softmax(-1)
    ctc_log_probs = torch.randn(batch, 2 * source, VOCAB, device=device).log_softmax(-1)
    targets = torch.randint(4, VOCAB - 1, (batch, source), device=device)
    return log_edges, dag_log_probs, graph_lengths, ctc_log_probs, targets, torch.full((batch,), source, device=device)


def _timed(step, repeats: int, device: str) -> dict:
    """First-call seconds, then the median seconds and (CUDA) peak MB of `repeats` more calls."""
    start = time.perf_counter()
    step()
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
    first = time.perf_counter() - start
    times, peaks = time_and_peak(step, repeats, device)
    return {"first_s": round(first, 4), "step_s": round(statistics.median(times), 5),
            "peak_mb": round(max(peaks), 1) if device == "cuda" else None}


def kernel_rows(args: argparse.Namespace) -> list[dict]:
    """The DAG loss's forward + backward through each DP against CTC's, per λ, token batch and tile bound."""
    import torch

    from reder import dag_triton
    from reder.objectives.terms import ctc_loss, dag_loss

    rows = []
    for ratio in args.ratios:
        for pair in args.token_grid:
            batch, source = (int(value) for value in pair.split(","))
            torch.manual_seed(0)
            log_edges, log_probs, graph_lengths, ctc_log_probs, targets, lengths = _token_batch(batch, source, ratio, args.device)
            leaves = [tensor.requires_grad_() for tensor in (log_edges, log_probs, ctc_log_probs)]

            def dag_step(dp: str) -> tuple:
                for leaf in leaves:
                    leaf.grad = None
                loss, _ = dag_loss(log_edges, log_probs, graph_lengths, targets, lengths, dp=dp)
                loss.backward()
                return loss.detach(), log_edges.grad, log_probs.grad

            def ctc_step() -> None:
                ctc_log_probs.grad = None
                ctc_loss(ctc_log_probs, 2 * lengths, targets, lengths, VOCAB - 1, 0.1).backward()

            for block in args.max_blocks:
                dag_triton.MAX_BLOCK = block
                differences = [float((a - b).abs().max()) for a, b in zip(dag_step("triton"), dag_step("torch"))]
                row = {"ratio": ratio, "batch": batch, "source_tokens": source, "graph_vertices": int(graph_lengths.max()),
                       "max_block": block, "max_abs_difference": dict(zip(("loss", "grad_log_edges", "grad_log_probs"),
                                                                          differences))}
                row["dag_triton"] = _timed(lambda: dag_step("triton"), args.repeats, args.device)
                row["dag_torch"] = _timed(lambda: dag_step("torch"), args.repeats, args.device)
                row["ctc"] = _timed(ctc_step, args.repeats, args.device)
                row["triton_over_torch"] = round(row["dag_triton"]["step_s"] / row["dag_torch"]["step_s"], 3)
                row["triton_over_ctc"] = round(row["dag_triton"]["step_s"] / row["ctc"]["step_s"], 3)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    return rows


def update_rows(args: argparse.Namespace) -> list[dict]:
    """Whole REDER updates at one token batch: CTC head, DAG head with each DP (seconds, DAG/CTC ratios)."""
    import torch

    from reder import EOS_ID, DuplexLoss, LossConfig, ModelConfig, REDER

    rows = []
    for pair in args.update_grid:
        batch, source = (int(value) for value in pair.split(","))
        torch.manual_seed(0)
        lengths = torch.full((batch,), source - 1, device=args.device)  # EOS included; the DAG head adds BOS: S
        src, tgt = (torch.randint(4, VOCAB - 1, (batch, source - 1), device=args.device).index_fill_(1, lengths[:1] - 1, EOS_ID)
                    for _ in range(2))
        for ratio in args.ratios:
            row = {"ratio": ratio, "batch": batch, "source_tokens": source}
            for name, head, dp in (("ctc", "ctc", "auto"), ("dag_torch", "dag", "torch"), ("dag_triton", "dag", "triton")):
                config = ModelConfig(vocab_size=VOCAB, d_model=512, n_heads=4, ffn_dim=1024, layers_per_end=3, dropout=0.3,
                                     head=head, graph_upsample_ratio=float(ratio), dag_dp=dp, max_positions=1024)
                model = REDER(config).to(args.device).train()
                objective = DuplexLoss(model, LossConfig(aux_start_step=10**9))
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

                def update() -> None:
                    optimizer.zero_grad(set_to_none=True)
                    with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.device == "cuda"):
                        terms = objective(src, lengths, tgt, lengths, 0)
                    terms["total"].backward()
                    optimizer.step()

                row[name] = _timed(update, args.repeats, args.device)
            for name in ("dag_torch", "dag_triton"):
                row[f"{name}_over_ctc"] = round(row[name]["step_s"] / row["ctc"]["step_s"], 3)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def triton_report(args: argparse.Namespace) -> None:
    """`--triton`: the kernel against the PyTorch DP and CTC (and whole updates), one JSON object."""
    import torch

    interpreted = args.device == "cpu"
    if interpreted:
        print("CPU: the Triton kernels run in Triton's interpreter; their differences are checked, their times are "
              "the interpreter's: no speed claim is made", file=sys.stderr)
    setup = {"dtype": "float32", "device": args.device, "torch": torch.__version__,
             "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "threads": torch.get_num_threads(),
             "repeats": args.repeats, "vocab": VOCAB, "speed_claim": not interpreted}
    report = {"setup": setup, "kernel": kernel_rows(args)}
    if args.update_grid:
        report["update"] = update_rows(args)
    print(json.dumps(report, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", nargs="+", default=["8,16,64", "8,32,128", "8,64,256"], help="B,M,L triples")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decode-lengths", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--decode-batch", type=int, default=16)
    parser.add_argument("--child", nargs=4, metavar=("B", "M", "L", "HAND_WRITTEN"), help=argparse.SUPPRESS)
    parser.add_argument("--triton", action="store_true", help="time the Triton DP against the PyTorch DP and CTC")
    parser.add_argument("--ratios", type=float, nargs="+", default=[2, 4, 8], help="--triton: λ values")
    parser.add_argument("--token-grid", nargs="+", default=None,
                        help="--triton: B,S pairs (default 64,24 on CUDA, 4,6 on CPU)")
    parser.add_argument("--max-blocks", type=int, nargs="+", default=[64], help="--triton: the kernels' tile bounds")
    parser.add_argument("--update-grid", nargs="*", default=[], help="--triton: B,S pairs of whole updates")
    args = parser.parse_args()
    if args.triton:
        if args.device == "cpu":
            os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
        args.token_grid = args.token_grid or (["64,24"] if args.device == "cuda" else ["4,6"])
        triton_report(args)
        return
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
