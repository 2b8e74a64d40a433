"""Where a REDER greedy decode spends its time: torch.profiler of batch 1 and batch N on CPU, the top ops and
the share that is not GEMM.

    python -m bench.decode_profile [--threads 2] [--sentences 100] [--batch 64] [--top 15] [--paths reference,fast]
        [--repeats 5] [--reder MODEL_DIR | --d-model 512 --heads 4 --ffn 1024 --layers 6] [--out FILE]

The model and sentences are bench.peers' (untrained d512 REDER, 6 layers per end, r = 2, CTC, the first
`--sentences` lines of Multi30k test 2016 English), decoded by `reder.translate.translate_ids` greedy. Paths:
`reference` is the plain trunk (`REDER.fast_inference = False`: the eager layers as trained), `fast` the inference
trunk (reder/runtime/onednn.py), `fast_matmul` that trunk on torch's default GEMM instead of oneDNN's on prepacked
weights (`reder.runtime.onednn.ONEDNN = False`), `compiled` the `--compile` option's trunk (reder/runtime/compiled.py: a batch
without padding through inductor with the weights frozen in, a padded one the fast trunk; compiled in the warm-up
pass), `int8` the fast trunk with its linear layers dynamically quantized (CPU).

Per path and batch size: the wall time per sentence without the profiler (median of `--repeats` passes over the
sentences, the paths' passes interleaved, each pass: batch 1 = one call per sentence, batch N = one call over all
in length-sorted batches), then one profiled pass: each op's self CPU time, the ops grouped as GEMM (aten::addmm/mm/bmm/baddbmm, quantized
linear), the fused attention kernel (SDPA: its q·k and p·v products and the softmax) and everything else. The
non-GEMM share is 1 − (GEMM + attention kernel) / the profiled pass's wall time (Python between the ops included;
both from the same pass, so a busy machine moves both; the profiler's own cost per op counts as non-GEMM, so the
share is an upper bound). `gemm_only_share` counts the attention kernel as non-GEMM too. `floor.gemm_replay`: the
matmuls of one batch-1 decode at the mean length alone, on the model's own weights streamed from memory ("cold") and on one layer's repeated
("warm", as the floor's rate is measured): what the GEMMs cost before any other op. `floor.weights_stream_ms`: those
weights over the memory's read rate (a large tensor's sum), what streaming them alone would take. The load average is
printed before and after: on a shared 2-core box, compare paths within one run. With one thread the process CPU time
(`cpu_ms_per_sentence`, and the floor from a GEMM rate per CPU second) is what a quiet machine's wall time would
be: the time the process was not scheduled is left out.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from bench import emit, peers

GEMM_OPS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv",
            "mkldnn::_linear_pointwise", "quantized::linear_dynamic", "aten::_weight_int8pack_mm",
            "aten::_weight_int4pack_mm")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu",)


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--paths", default="reference,fast")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--data", default=str(peers.MULTI30K))
    parser.add_argument("--work", default=str(Path(peers.tempfile.gettempdir()) / "duplex-bench-peers"))
    parser.add_argument("--reder", help="a REDER model directory (default: untrained, of the size below)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args(argv)
    args.device = "cpu"
    return args


def split(events: Any, calls: int) -> dict[str, Any]:
    """Self CPU time (ms per decode call) of GEMM ops, the attention kernel and the rest, from key_averages."""
    gemm = sum(e.self_cpu_time_total for e in events if e.key in GEMM_OPS) / 1000 / calls
    attention = sum(e.self_cpu_time_total for e in events if e.key in ATTENTION_OPS) / 1000 / calls
    total = sum(e.self_cpu_time_total for e in events) / 1000 / calls
    ops = sum(e.count for e in events if not e.key.startswith("aten::as_strided")) / calls
    return {"gemm_ms": round(gemm, 3), "attention_kernel_ms": round(attention, 3),
            "other_ms": round(total - gemm - attention, 3), "profiled_ms": round(total, 3), "ops_per_call": round(ops)}


def one_pass(decode: Callable[[list[list[int]], int], Any], sequences: list[list[int]], batch: int) -> tuple[float, float]:
    """Wall and process CPU ms per sentence of one pass: batch 1 = one call per sentence, else one call at `batch`."""
    start, cpu = time.perf_counter(), time.process_time()
    if batch == 1:
        for sequence in sequences:
            decode([sequence], 1)
    else:
        decode(sequences, batch)
    return 1000 * (time.perf_counter() - start) / len(sequences), 1000 * (time.process_time() - cpu) / len(sequences)


def profiled(decode: Callable[[list[list[int]], int], Any], sequences: list[list[int]], batch: int,
             top: int) -> dict[str, Any]:
    """One profiled pass: the GEMM / attention kernel / other split per sentence and the top ops by self time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall, _ = one_pass(decode, sequences, batch)
    events = prof.key_averages()
    parts = split(events, len(sequences))  # per sentence
    arithmetic = parts["gemm_ms"] + parts["attention_kernel_ms"]
    rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {**parts, "profiled_wall_ms": round(wall, 3), "non_gemm_share": round(1 - arithmetic / wall, 3),
            "gemm_only_share": round(1 - parts["gemm_ms"] / wall, 3),
            "top_ops": [{"op": e.key, "self_ms_per_sentence": round(e.self_cpu_time_total / 1000 / len(sequences), 3),
                         "calls_per_sentence": round(e.count / len(sequences), 1)} for e in rows]}


def decoder(model: Any, path: str) -> Callable[[list[list[int]], int], Any]:
    """Greedy `translate_ids` through `path`: reference (fast_inference off), fast, fast_matmul (the fast trunk on
    torch's default GEMM instead of the prepacked oneDNN kernel), compiled (reder/runtime/compiled.py's trunk: unpadded
    batches through inductor with the weights frozen in, compiled in the warm-up pass), int8 (a quantized copy)."""
    import reder.runtime.onednn
    from reder.runtime.compiled import StaticTrunk
    from reder.decoding.run import translate_ids

    chosen = reder.runtime.onednn.quantized(model) if path == "int8" else model
    onednn = reder.runtime.onednn.ONEDNN
    trunk = StaticTrunk(torch.device("cpu")) if path == "compiled" else None

    def decode(batch: list[list[int]], size: int) -> Any:
        chosen.fast_inference, chosen.static_trunk = path != "reference", trunk
        reder.runtime.onednn.ONEDNN = onednn and path != "fast_matmul"
        try:
            return translate_ids(chosen, batch, "src2tgt", batch_size=size)
        finally:
            reder.runtime.onednn.ONEDNN, chosen.static_trunk = onednn, None

    return decode


def gemm_replay(model: Any, length: int, rounds: int = 20) -> dict[str, float]:
    """The matmuls of one batch-1 decode alone, back to back, through the fast path's kernels (reder.runtime.onednn's
    `linear` and `tied_logits`) at T = r·`length` rows, ms per decode (median of 3 timings of `rounds`): "cold" on
    each layer's own weights in order, as a decode streams them from memory; "warm" on the first layer's weights
    only, repeated, as the floor's rate measurement does. Their gap is the weights' memory traffic, not overhead."""
    from reder.runtime.onednn import linear, tied_logits

    layers = [(layer.attention.attention, layer.feed_forward) for layer, _ in model.ops("src2tgt")]
    calls = [module for attention, ffn in layers for module in (attention.qkv, attention.out, ffn.inner, ffn.outer)]
    rows = model.cfg.upsample_ratio * length
    inputs = {module.in_features: torch.randn(rows, module.in_features) for module in calls}
    gelu = {id(ffn.inner) for _, ffn in layers}

    def replay(modules: list[Any]) -> float:
        start = time.perf_counter()
        for _ in range(rounds):
            for module in modules:
                linear(module, inputs[module.in_features], gelu=id(module) in gelu)
            tied_logits(inputs[model.cfg.d_model], model.embed.weight)
        return 1000 * (time.perf_counter() - start) / rounds

    warm = calls[:4] * len(layers)
    replay(calls), replay(warm)  # the packed weights built, caches settled
    return {"cold_ms": round(statistics.median(replay(calls) for _ in range(3)), 3),
            "warm_ms": round(statistics.median(replay(warm) for _ in range(3)), 3)}


def read_bandwidth(megabytes: int = 256, rounds: int = 7) -> float:
    """The memory's read rate (GB/s) with the session's threads: a sum over a float32 tensor far larger than any
    cache (median of `rounds`). Over it, the weights a decode reads from memory give a bandwidth floor to set
    beside the FLOP floor: what streaming them alone would take."""
    x = torch.randn(megabytes * 2**20 // 4)
    x.sum()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - start)
    return x.numel() * 4 / statistics.median(times) / 1e9


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _args(argv)
    torch.set_num_threads(args.threads)
    spm = peers.spm_model(args)
    sequences = peers.sources(args, spm)
    base = peers.reder_model(args, args.vocab)
    report: dict[str, Any] = {"benchmark": "decode_profile", "threads": args.threads, "sentences": len(sequences),
                              "mean_source_pieces": round(sum(map(len, sequences)) / len(sequences), 2),
                              "load_before": [round(x, 2) for x in os.getloadavg()], "paths": {}}
    paths = args.paths.split(",")
    with torch.inference_mode():
        decoders = {path: decoder(base, path) for path in paths}
        for size in (1, args.batch):
            walls: dict[str, list[tuple[float, float]]] = {path: [] for path in paths}
            for path in paths:
                one_pass(decoders[path], sequences, size)  # warm-up: allocator, kernels
            for _ in range(args.repeats):  # the paths interleaved: a load change hits all of them
                for path in paths:
                    walls[path].append(one_pass(decoders[path], sequences, size))
            for path in paths:
                report["paths"].setdefault(path, {})[f"batch{size}"] = {
                    "wall_ms_per_sentence": round(statistics.median(w for w, _ in walls[path]), 3),
                    "wall_ms_repeats": [round(w, 3) for w, _ in walls[path]],
                    "cpu_ms_per_sentence": round(statistics.median(c for _, c in walls[path]), 3),
                    "cpu_ms_repeats": [round(c, 3) for _, c in walls[path]],
                    **profiled(decoders[path], sequences, size, args.top)}
        mean_length = round(sum(map(len, sequences)) / len(sequences))
        replay = gemm_replay(base, mean_length)
        bandwidth = read_bandwidth()
        rates = {kernel: (peers.gemm_rate(base.cfg, mean_length, "cpu", kernel=kernel),
                          peers.gemm_rate(base.cfg, mean_length, "cpu", clock=time.process_time, kernel=kernel))
                 for kernel in peers.gemm_kernels("cpu")}
    rate, cpu_rate = max(wall for wall, _ in rates.values()), max(cpu for _, cpu in rates.values())
    weights = 4 * sum(p.numel() for layer, _ in base.ops("src2tgt") for p in layer.parameters()) + 4 * base.embed.weight.numel()
    flops = sum(peers.reder_flops(base.cfg, len(s)) for s in sequences) / len(sequences)
    floor, cpu_floor, matmul_floor = 1000 * flops / rate, 1000 * flops / cpu_rate, 1000 * flops / rates["matmul"][0]
    report["floor"] = {"gemm_gflops_per_s": round(rate / 1e9, 1), "floor_ms": round(floor, 3),
                       "gemm_gflops_per_cpu_s": round(cpu_rate / 1e9, 1), "floor_cpu_ms": round(cpu_floor, 3),
                       "kernels_gflops_per_s": {kernel: round(wall / 1e9, 1) for kernel, (wall, _) in rates.items()},
                       "matmul_floor_ms": round(matmul_floor, 3),  # torch's default GEMM alone: the floor before
                       # a decode's own matmuls alone at the mean length (fast path's kernels), cold and warm weights
                       "gemm_replay": {**replay, "cold_over_floor": round(replay["cold_ms"] / floor, 2)},
                       # the weights a batch-1 decode reads (trunk and tied projection), streamed at the read rate
                       "memory_read_gb_per_s": round(bandwidth, 1), "weights_mb": round(weights / 1e6, 1),
                       "weights_stream_ms": round(1000 * weights / bandwidth / 1e9, 3)}
    for numbers in report["paths"].values():
        for entry in numbers.values():
            entry["over_floor"] = round(entry["wall_ms_per_sentence"] / floor, 2)
            entry["cpu_over_floor"] = round(entry["cpu_ms_per_sentence"] / cpu_floor, 2)
            entry["over_matmul_floor"] = round(entry["wall_ms_per_sentence"] / matmul_floor, 2)
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    _print_tables(report)
    print(f"## floor {report['floor']['floor_ms']} ms at {report['floor']['gemm_gflops_per_s']} GFLOP/s "
          f"(kernels: {report['floor']['kernels_gflops_per_s']}); a decode's matmuls alone: "
          f"{report['floor']['gemm_replay']}; its weights ({report['floor']['weights_mb']} MB) streamed at "
          f"{report['floor']['memory_read_gb_per_s']} GB/s: {report['floor']['weights_stream_ms']} ms")
    return emit(report, args.out)


def _print_tables(report: dict[str, Any]) -> None:
    for path, numbers in report["paths"].items():
        for name, entry in numbers.items():
            print(f"## {path} {name}: {entry['wall_ms_per_sentence']} ms/sentence (over floor {entry['over_floor']}; over "
                  f"the default-GEMM floor {entry['over_matmul_floor']}), "
                  f"CPU {entry['cpu_ms_per_sentence']} ms (over the CPU-time floor {entry['cpu_over_floor']}), "
                  f"GEMM {entry['gemm_ms']} + attention {entry['attention_kernel_ms']} ms, non-GEMM share "
                  f"{entry['non_gemm_share']}, {entry['ops_per_call']} ops per sentence")
            for row in entry["top_ops"]:
                print(f"  {row['op']:<55} {row['self_ms_per_sentence']:>9.3f} ms {row['calls_per_sentence']:>8.1f} calls")


if __name__ == "__main__":
    main()
