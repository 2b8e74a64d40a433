"""Activation memory and step time of a REDER training step, memory-efficient vs plain autograd.

    python -m bench.memory [--depths 2 4 8 16] [--device cpu|cuda] [--steps 3]

Prints one JSON object. Each configuration runs in its own subprocess. On CPU the activation memory is
the peak RSS during one training step (forward + backward of both CTC directions) minus the RSS just
before it, with glibc's mmap threshold pinned so freed blocks go back to the OS and the peak is real
(VmHWM reset through /proc/self/clear_refs). On CUDA it is torch.cuda.max_memory_allocated over the step
minus the memory allocated before it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from bench.peak import PINNED_MALLOC, time_and_peak

D_MODEL, N_HEADS, FFN_DIM, VOCAB, BATCH, SRC_LENGTH = 256, 4, 1024, 1000, 16, 32


def measure(layers_per_end: int, memory_efficient: bool, aux: bool, device: str, steps: int, joint: bool) -> dict:
    """One configuration, in this process: returns activation MB and median step seconds."""
    import torch

    from reder import DIRECTIONS, EOS_ID, DuplexLoss, LossConfig, ModelConfig, REDER

    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cfg = ModelConfig(vocab_size=VOCAB, d_model=D_MODEL, n_heads=N_HEADS, ffn_dim=FFN_DIM, layers_per_end=layers_per_end,
                      dropout=0.1, upsample_ratio=2, memory_efficient=memory_efficient)
    loss_config = LossConfig(lambda_fba=0.1 if aux else 0.0, lambda_cc=0.0, aux_start_step=0)
    model = REDER(cfg).to(device).train()
    objective = DuplexLoss(model, loss_config)
    tokens = torch.randint(4, VOCAB - 1, (BATCH, SRC_LENGTH), device=device)
    tokens[:, -1] = EOS_ID
    lengths = torch.full((BATCH,), SRC_LENGTH, device=device)

    def step() -> None:
        for directions in ((DIRECTIONS,) if joint else ((d,) for d in DIRECTIONS)):
            objective(tokens, lengths, tokens.roll(1, dims=1), lengths, 0, directions=directions)["total"].backward()

    step()  # warm-up: ActNorm init, .grad buffers, allocator pools
    times, peaks = time_and_peak(step, steps, device)
    return {"layers_per_end": layers_per_end, "memory_efficient": memory_efficient, "fba": aux, "joint_backward": joint,
            "activation_mb": round(max(peaks), 1), "step_s": round(statistics.median(times), 4)}


def _run_child(depth: int, efficient: bool, aux: bool, args: argparse.Namespace) -> dict:
    env = dict(os.environ, **PINNED_MALLOC)
    command = [sys.executable, "-m", "bench.memory", "--child", str(depth), str(int(efficient)), str(int(aux)),
               "--device", args.device, "--steps", str(args.steps)] + (["--joint"] if args.joint else [])
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--joint", action="store_true", help="one backward over both directions (default: one per direction)")
    parser.add_argument("--child", nargs=3, metavar=("LAYERS", "MEMORY_EFFICIENT", "FBA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        layers, efficient, aux = int(args.child[0]), args.child[1] == "1", args.child[2] == "1"
        print(json.dumps(measure(layers, efficient, aux, args.device, args.steps, args.joint)))
        return
    rows = {}
    for aux in (False, True):
        for efficient in (False, True):
            for depth in args.depths:
                rows[depth, efficient, aux] = _run_child(depth, efficient, aux, args)
                print(json.dumps(rows[depth, efficient, aux]), file=sys.stderr)
    shallow, deep = min(args.depths), max(args.depths)
    summary = {}
    for aux in (False, True):
        tag = "_fba" if aux else ""
        for efficient, name in ((True, "memory_efficient"), (False, "plain")):
            growth = rows[deep, efficient, aux]["activation_mb"] / rows[shallow, efficient, aux]["activation_mb"]
            summary[f"{name}{tag}_growth_{shallow}_to_{deep}"] = round(growth, 2)
        summary[f"step_time_overhead{tag}"] = {
            depth: round(rows[depth, True, aux]["step_s"] / rows[depth, False, aux]["step_s"], 2) for depth in args.depths}
    import torch

    setup = {"d_model": D_MODEL, "n_heads": N_HEADS, "ffn_dim": FFN_DIM, "vocab_size": VOCAB, "batch": BATCH,
             "src_length": SRC_LENGTH, "upsample_ratio": 2, "dropout": 0.1, "device": args.device,
             "backward": "joint" if args.joint else "per direction", "torch": torch.__version__,
             "threads": torch.get_num_threads()}
    print(json.dumps({"setup": setup, "results": list(rows.values()), "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
