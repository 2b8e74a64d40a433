"""REDER against the engines people run: our AR teacher and CTranslate2, models of equal size, one process per engine.

    python -m bench.peers [--threads 2] [--sentences 100] [--device cpu|cuda] [--engines reder,teacher,ct2]
        [--repeats 5] [--latency-repeats 1] [--out FILE]
        [--reder MODEL_DIR --teacher MODEL_DIR | --d-model 512 --heads 4 --ffn 1024 --layers 6]

Each engine runs in its own Python process (`--worker ENGINE`), so no engine inherits another's threads,
caches or allocator state; the driver prints one JSON object with every engine's numbers, the ratios and
REDER's distance from its FLOP floor.

Models: without `--reder`/`--teacher`, untrained models of one size (d_model, heads, FFN, `--layers` encoder +
decoder layers for the AR Transformer and per end for REDER, r = 2, CTC) over a joint SentencePiece model of
`--vocab` pieces trained on Multi30k train (cached in `--work`). Untrained AR models never end a sentence, so
their outputs are forced to `--ar-tokens` tokens (max_len_a 0, max_len_b ar_tokens + 1: every output that
long, EOS forced): the AR engines all do the same number of steps, as in the target table (16). With model
directories, each decodes as trained (default length limits), the CTranslate2 model converted from `--teacher`.

Inputs: the first `--sentences` lines of Multi30k test-2016 English. Per engine and decoder:
  - `latency_ms`: batch 1, each sentence its own call (mean over the sentences, after one warm-up call; the
    median of `--latency-repeats` such passes, all of them in `latency_ms_repeats`), the user's path: ids in,
    ids out (`reder.translate.translate_ids`; CTranslate2's `translate_batch`);
  - `sentences_per_s`: all sentences in one call at batch `--batch` (length-sorted batches): the median of
    `--repeats` calls, all of them in `sentences_per_s_repeats` and their spread (max − min) / median.
Engines and decoders:
  - `reder`: greedy (the inference trunk, reder/runtime/onednn.py: packed batches, no padding outside the attention,
    the attention in length groups), `greedy_one_group` (the same, the attention one padded batch: as before the
    length groups), on CPU `greedy_matmul` (the same on torch's default GEMM, `reder.runtime.onednn.ONEDNN = False`:
    before the prepacked oneDNN kernel), `greedy_reference` (the reference path, `fast_inference = False`: what
    greedy was before the inference trunk), on CPU `greedy_int8` (the trunk's linear layers int8,
    `reder.runtime.onednn.quantized`), and CTC prefix beam `--beam`
    (REDER.translate under inference mode); with `--compile` also greedy with the trunk under `torch.compile`
    (reder/runtime/compiled.py: on CUDA at bucketed static shapes under CUDA graphs, on a CPU a batch without padding through
    inductor with the weights frozen in, a padded one eagerly packed; `greedy_compiled`, and `compile_s`: compiling
    every graph the timed calls meet, before them);
  - `teacher`: our Transformer, greedy and beam 4 (its `greedy` and `beam` decoders);
  - `ct2`: CTranslate2 (optional extra) on the teacher converted by `reder.ct2` (float32), greedy and beam 4,
    one `translate_batch` per length-sorted batch, as one runs it (`ct2_mirror_beam4`: `reder.ct2.translate_ids`,
    which reproduces our search's outputs, for KD, with `--mirror`); on CPU also greedy with compute_type int8 (`greedy_int8`).
FLOP floor (reder worker): REDER's forward FLOPs for each test sentence from the config (2·m·n·k per matmul:
q/k/v and output projections, relative attention, FFN, tied output projection over r·|x| positions; no
norms or softmaxes), over the float32 GEMM rate of the same shapes measured in the same process with the same
threads, of the faster kernel (torch's default GEMM, or on CPU oneDNN's on a prepacked weight, the inference trunk's;
`*_over_matmul_floor` against the default GEMM's rate alone, this bench's floor before): the time a perfect
implementation of these matmuls would need at batch 1. FLOP ceiling at batch N
(`ceiling`): the same FLOPs over the GEMM rate of batch-N shapes (r·|x|·N rows): the sentences/s a perfect
implementation would reach; `greedy_of_ceiling` is greedy's median sentences/s over it. Each GEMM rate is measured
before the decoders and after them, the higher one used (both in `gemm_gflops_measured`: GFLOP/s, per wall and CPU
second, at batch 1 and at the batch). Floor and ceiling count the
real work only: each sentence's FLOPs at its own length (its attention |x|², not the batch's longest squared), so
every padded position a decoder computes counts against it.
Token equality (reder worker, `token_equal`): how many sentences each greedy path (the fast ones, compiled with
`--compile`) decodes exactly as the eager reference path at batch 1, at batch 1 and at `--batch`, on the device timed.
The driver's JSON (also written to `--out`) holds the load average before and after each worker; a worker that
fails is reported there (`failed`: its stderr's end) beside the others' numbers, and the run exits 1. Beside every
wall-clock figure, the process's CPU time (`cpu_latency_ms`, `sentences_per_cpu_s`, the floor and ceiling from
GEMM rates per CPU second): with `--threads 1` on a busy shared machine, what a quiet one's wall time would be.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from bench import MULTI30K, REPO_ROOT, emit

ENGINES = ("reder", "teacher", "ct2")
ONE_GROUP = 10**9  # reder.runtime.onednn.GROUP_COST that makes a batch's attention one padded group (as before length groups)


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--beam", type=int, default=20, help="REDER's CTC prefix beam")
    parser.add_argument("--data", default=str(MULTI30K))
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "duplex-bench-peers"))
    parser.add_argument("--reder", help="a REDER model directory (default: untrained, of the size below)")
    parser.add_argument("--teacher", help="a teacher model directory for src2tgt (default: untrained)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=6, help="AR: encoder and decoder layers each; REDER: per end")
    parser.add_argument("--ar-tokens", type=int, default=16, help="untrained AR outputs: forced length")
    parser.add_argument("--compile", action="store_true",
                        help="also time REDER greedy with its trunk under torch.compile (reder/runtime/compiled.py)")
    parser.add_argument("--repeats", type=int, default=5, help="calls at batch --batch per decoder (median, spread)")
    parser.add_argument("--latency-repeats", type=int, default=1, help="passes of batch-1 calls per decoder (median)")
    parser.add_argument("--out", help="also write the driver's JSON here")
    parser.add_argument("--mirror", action="store_true", help="also time CTranslate2 mirroring our beam search (KD)")
    return parser.parse_args(argv)


def spm_model(args: argparse.Namespace) -> Path:
    """The joint SentencePiece model of `--vocab` pieces on Multi30k train, trained once into `--work`."""
    path = Path(args.work) / f"spm{args.vocab}.model"
    if not path.exists():
        from pipeline.stages.spm import train

        lines = [line for side in ("en", "de")
                 for line in (Path(args.data) / f"train.{side}").read_text(encoding="utf-8").splitlines()]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(train(lines, args.vocab))
        tmp.replace(path)
    return path


def sources(args: argparse.Namespace, spm: Path) -> list[list[int]]:
    import sentencepiece

    from reder.decoding.run import encode_lines

    lines = (Path(args.data) / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[: args.sentences]
    return encode_lines(sentencepiece.SentencePieceProcessor(model_file=str(spm)), lines)


def _time(translate: Callable[[list[list[int]], int], Any], sequences: list[list[int]], batch: int,
          device: str, repeats: int = 1, latency_repeats: int = 1) -> dict[str, Any]:
    """Batch-1 latency (ms; mean over the sentences, median of `latency_repeats` passes) and sentences/s of one
    call over all at `batch` (median of `repeats` calls, with every call's figure and the spread)."""
    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    translate(sequences[:1], 1)
    translate(sequences[:batch], batch)  # warm-up of both shapes (allocator, kernels, lazy init)
    sync()
    latencies, cpu_latencies = [], []
    for _ in range(max(1, latency_repeats)):
        times, cpu = [], time.process_time()
        for sequence in sequences:
            start = time.perf_counter()
            translate([sequence], 1)
            sync()
            times.append(time.perf_counter() - start)
        latencies.append(1000 * sum(times) / len(times))
        cpu_latencies.append(1000 * (time.process_time() - cpu) / len(sequences))
    rates, cpu_rates = [], []
    for _ in range(max(1, repeats)):
        start, cpu = time.perf_counter(), time.process_time()
        translate(sequences, batch)
        sync()
        rates.append(len(sequences) / (time.perf_counter() - start))
        cpu_rates.append(len(sequences) / (time.process_time() - cpu))
    rate, cpu_rate = statistics.median(rates), statistics.median(cpu_rates)
    return {"latency_ms": round(statistics.median(latencies), 3), "latency_ms_repeats": [round(x, 3) for x in latencies],
            "sentences_per_s": round(rate, 2), "sentences_per_s_repeats": [round(x, 2) for x in rates],
            "sentences_per_s_spread": round((max(rates) - min(rates)) / rate, 3),
            "cpu_latency_ms": round(statistics.median(cpu_latencies), 3),
            "sentences_per_cpu_s": round(cpu_rate, 2), "sentences_per_cpu_s_repeats": [round(x, 2) for x in cpu_rates],
            "sentences_per_cpu_s_spread": round((max(cpu_rates) - min(cpu_rates)) / cpu_rate, 3)}


def reder_model(args: argparse.Namespace, vocab: int) -> Any:
    from reder import ModelConfig
    from reder.checkpoint import load_model_dir
    from reder.model import REDER

    if args.reder:
        return load_model_dir(Path(args.reder), args.device)[0].eval()
    torch.manual_seed(0)
    model = REDER(ModelConfig(vocab_size=vocab, d_model=args.d_model, n_heads=args.heads, ffn_dim=args.ffn,
                              layers_per_end=args.layers, dropout=0.0, upsample_ratio=2, max_positions=512))
    model.actnorm["src"].initialized.fill_(True)  # identity ActNorm: an untrained model is only timed
    model.actnorm["tgt"].initialized.fill_(True)
    return model.to(args.device).eval()


def teacher_model(args: argparse.Namespace, vocab: int) -> Any:
    from reder import TransformerConfig
    from reder.autoregressive import Transformer
    from reder.checkpoint import load_model_dir

    if args.teacher:
        return load_model_dir(Path(args.teacher), args.device)[0].eval()
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=vocab, d_model=args.d_model, n_heads=args.heads, ffn_dim=args.ffn,
                                         encoder_layers=args.layers, decoder_layers=args.layers, dropout=0.0,
                                         max_positions=512)).to(args.device).eval()


def ar_search(args: argparse.Namespace) -> dict[str, Any]:
    """Length limits of the AR engines: as trained with model directories, else forced to `--ar-tokens`."""
    return {} if args.teacher else {"max_len_a": 0.0, "max_len_b": args.ar_tokens + 1}


def reder_flops(cfg: Any, source_length: int) -> int:
    """Forward FLOPs (2·m·n·k per matmul) of one sentence of `source_length` pieces (EOS included), CTC head."""
    t, d, f, v = cfg.upsample_ratio * source_length, cfg.d_model, cfg.ffn_dim, cfg.vocab_size
    relative = 2 * cfg.max_relative_distance + 1
    layer = 2 * t * d * 3 * d + 2 * t * d * d + 2 * 2 * t * d * f + 2 * 2 * t * t * d + 2 * t * d * relative
    return 2 * cfg.layers_per_end * layer + 2 * t * d * v


def gemm_rate(cfg: Any, length: int, device: str, seconds: float = 2.0, batch: int = 1,
              clock: Callable[[], float] = time.perf_counter, kernel: str = "matmul") -> float:
    """FLOP/s of float32 matmuls of REDER's shapes at `batch` (T = r·length·batch rows), measured for ~`seconds` of
    `clock` (time.process_time: FLOP per CPU second of this process). `kernel`: "matmul" (torch's default GEMM,
    `a @ b`) or "onednn" (the inference trunk's CPU kernel: oneDNN's matmul on weights reordered once)."""
    t, d, f, v = cfg.upsample_ratio * length * batch, cfg.d_model, cfg.ffn_dim, cfg.vocab_size
    shapes = [(t, d, 3 * d), (t, d, d), (t, d, f), (t, f, d), (t, d, v)]
    pairs = [(torch.randn(m, k, device=device), torch.randn(k, n, device=device)) for m, k, n in shapes]
    flops = sum(2 * m * k * n for m, k, n in shapes)
    if kernel == "onednn":
        weights = [torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous()) for _, b in pairs]

        def one_round() -> None:
            for (a, _), w in zip(pairs, weights):
                torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")
    else:
        def one_round() -> None:
            for a, b in pairs:
                a @ b
    one_round()
    rounds, start = 0, clock()
    while clock() - start < seconds:
        one_round()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        rounds += 1
    return rounds * flops / (clock() - start)


def gemm_kernels(device: str) -> tuple[str, ...]:
    """The GEMM kernels a floor is measured with on `device`: the fastest of them sets it."""
    return ("matmul", "onednn") if device == "cpu" and torch.backends.mkldnn.is_available() else ("matmul",)


def work_reder(args: argparse.Namespace, sequences: list[list[int]], vocab: int) -> dict[str, Any]:
    import reder.runtime.onednn
    from reder.decoding.run import choose, translate_ids
    from reder.runtime.onednn import quantized

    model = reder_model(args, vocab)
    int8 = quantized(model) if args.device == "cpu" else None
    before = measure_gemm(model.cfg, sequences, args)
    out: dict[str, Any] = {}
    outputs: dict[str, tuple[list[list[int]], list[list[int]]]] = {}  # each greedy path's, at batch 1 and --batch
    grouped, onednn = reder.runtime.onednn.GROUP_COST, reder.runtime.onednn.ONEDNN
    runs = [("greedy", model, True, 1, grouped, onednn), ("greedy_one_group", model, True, 1, ONE_GROUP, onednn)] + (
        [("greedy_matmul", model, True, 1, grouped, False)] if onednn and args.device == "cpu" else []) + [
        ("greedy_reference", model, False, 1, grouped, onednn)] + (
        [("greedy_int8", int8, True, 1, grouped, onednn)] if int8 is not None else []) + [
        (f"beam{args.beam}", model, True, args.beam, grouped, onednn)]
    for name, chosen, fast, beam, group_cost, kernel in runs:
        def run(batch: list[list[int]], size: int, chosen: Any = chosen, fast: bool = fast, beam: int = beam,
                group_cost: int = group_cost, kernel: bool = kernel) -> Any:
            chosen.fast_inference = fast
            reder.runtime.onednn.GROUP_COST, reder.runtime.onednn.ONEDNN = group_cost, kernel
            return translate_ids(chosen, batch, "src2tgt", choose(chosen, beam=beam), size)

        out[name] = _time(run, sequences, args.batch, args.device, args.repeats, args.latency_repeats)
        if beam == 1:
            outputs[name] = (run(sequences, 1), run(sequences, args.batch))
    model.fast_inference, reder.runtime.onednn.GROUP_COST, reder.runtime.onednn.ONEDNN = True, grouped, onednn
    if args.compile:  # the trunk under torch.compile (CUDA graphs at static bucketed shapes on CUDA): reder/runtime/compiled.py
        from reder.runtime.compiled import compiled

        started = time.perf_counter()
        compiled(model)
        for size in (1, args.batch):  # every graph the timed calls meet, compiled before they start
            translate_ids(model, sequences, "src2tgt", batch_size=size)
        out["compile_s"] = round(time.perf_counter() - started, 1)
        out["greedy_compiled"] = _time(lambda batch, size: translate_ids(model, batch, "src2tgt", batch_size=size), sequences,
                                       args.batch, args.device, args.repeats, args.latency_repeats)
        outputs["greedy_compiled"] = tuple(translate_ids(model, sequences, "src2tgt", batch_size=size)
                                           for size in (1, args.batch))
    out["token_equal"] = token_equal(outputs, args.batch)
    rates = gemm_rates(model.cfg, sequences, args, before)  # the best of the two measurements: the ceiling stays high
    rate, cpu_rate, batch_rate, cpu_batch_rate = (rates[key] for key in ("wall", "cpu", "wall_batch", "cpu_batch"))
    mean_flops = sum(reder_flops(model.cfg, len(s)) for s in sequences) / len(sequences)
    floor_ms = 1000 * mean_flops / rate
    timed = [name for name in ("greedy", "greedy_one_group", "greedy_matmul", "greedy_reference", "greedy_compiled")
             if name in out]
    out["floor"] = {"gemm_gflops_per_s": round(rate / 1e9, 1), "mean_gflop": round(mean_flops / 1e9, 3),
                    "floor_ms": round(floor_ms, 3), **{f"{name}_over_floor": round(out[name]["latency_ms"] / floor_ms, 2)
                                                       for name in timed},
                    "gemm_gflops_per_cpu_s": round(cpu_rate / 1e9, 1), "floor_cpu_ms": round(1000 * mean_flops / cpu_rate, 3),
                    **{f"{name}_cpu_over_floor": round(out[name]["cpu_latency_ms"] / (1000 * mean_flops / cpu_rate), 2)
                       for name in timed},
                    # the floor at torch's default GEMM alone (the floor of this bench before the oneDNN kernel)
                    "matmul_gemm_gflops_per_s": round(rates["matmul"] / 1e9, 1),
                    **{f"{name}_over_matmul_floor":
                       round(out[name]["latency_ms"] * rates["matmul"] / mean_flops / 1000, 2) for name in timed}}
    ceiling, cpu_ceiling = batch_rate / mean_flops, cpu_batch_rate / mean_flops
    out["ceiling"] = {"batch": args.batch, "gemm_gflops_per_s": round(batch_rate / 1e9, 1),
                      "sentences_per_s": round(ceiling, 2),
                      **{f"{name}_of_ceiling": round(out[name]["sentences_per_s"] / ceiling, 3)
                         for name in timed},
                      "gemm_gflops_per_cpu_s": round(cpu_batch_rate / 1e9, 1), "sentences_per_cpu_s": round(cpu_ceiling, 2),
                      **{f"{name}_of_cpu_ceiling": round(out[name]["sentences_per_cpu_s"] / cpu_ceiling, 3)
                         for name in timed}}
    out["gemm_gflops_measured"] = rates["measured"]
    out["parameters"] = sum(p.numel() for p in model.parameters())
    return out


def token_equal(outputs: dict[str, tuple[list[list[int]], list[list[int]]]], batch: int) -> dict[str, Any]:
    """How many sentences each greedy path decodes token for token as the eager reference path at batch 1 (no
    padding), at batch 1 and at `batch`: the fast paths' outputs checked on the device they were timed on."""
    reference = outputs["greedy_reference"][0]
    equal = {f"{name}_batch{size}": sum(a == b for a, b in zip(decoded, reference))
             for name, pair in outputs.items() for size, decoded in zip((1, batch), pair)}
    return {"reference": "greedy_reference_batch1", "sentences": len(reference), **equal}


def gemm_rates(cfg: Any, sequences: list[list[int]], args: argparse.Namespace,
               before: dict[str, float]) -> dict[str, Any]:
    """The GEMM rates of the floor (batch-1 shapes) and the ceiling (batch shapes), per wall and per CPU second:
    each the higher of `before` (measured before the decoders ran) and a measurement now, after them (a busy
    machine lowers a rate more often than it raises one; the higher rate is the harder floor and ceiling). Also
    both measurements in GFLOP/s, under "measured"."""
    after = measure_gemm(cfg, sequences, args)
    keys = [key for key in before if key != "kernels"]
    best: dict[str, Any] = {key: max(before[key], after[key]) for key in keys}
    best["matmul"] = max(before["kernels"]["wall"]["matmul"], after["kernels"]["wall"]["matmul"])
    best["measured"] = {key: {kernel: [round(before["kernels"][key][kernel] / 1e9, 1),
                                       round(after["kernels"][key][kernel] / 1e9, 1)]
                              for kernel in before["kernels"][key]} for key in keys}
    return best


def measure_gemm(cfg: Any, sequences: list[list[int]], args: argparse.Namespace) -> dict[str, float]:
    """The GEMM rate at the mean length's batch-1 and batch-`--batch` shapes, per wall and per CPU second: of the
    fastest kernel (`gemm_kernels`), each kernel's under "kernels"."""
    length, batch = round(sum(map(len, sequences)) / len(sequences)), min(args.batch, len(sequences))
    shapes = {"wall": (1, time.perf_counter), "cpu": (1, time.process_time), "wall_batch": (batch, time.perf_counter),
              "cpu_batch": (batch, time.process_time)}
    kernels = {key: {kernel: gemm_rate(cfg, length, args.device, batch=size, clock=clock, kernel=kernel)
                     for kernel in gemm_kernels(args.device)} for key, (size, clock) in shapes.items()}
    return {**{key: max(rates.values()) for key, rates in kernels.items()}, "kernels": kernels}


def work_teacher(args: argparse.Namespace, sequences: list[list[int]], vocab: int) -> dict[str, Any]:
    from reder.decoding.run import translate_ids

    model, search = teacher_model(args, vocab), ar_search(args)
    out: dict[str, Any] = {f"{'greedy' if beam == 1 else f'beam{beam}'}": _time(
        lambda batch, size, beam=beam: translate_ids(model, batch, "src2tgt", "beam", size, beam_size=beam, **search),
        sequences,
        args.batch, args.device) for beam in (1, 4)}
    out["parameters"] = sum(p.numel() for p in model.parameters())
    return out


def work_ct2(args: argparse.Namespace, sequences: list[list[int]], vocab: int, spm: Path) -> dict[str, Any]:
    import ctranslate2

    from reder import ct2

    model, search = teacher_model(args, vocab).cpu(), ar_search(args)
    a, b = search.get("max_len_a", 1.2), search.get("max_len_b", 10)
    with tempfile.TemporaryDirectory() as tmp:
        ct2_dir = ct2.convert_model(model, spm, Path(tmp) / "ct2")
        device = "cuda" if args.device.startswith("cuda") else "cpu"
        translator = ct2.load_translator(ct2_dir, device=device, threads=args.threads)
        def plain(batch: list[list[int]], size: int, beam: int) -> None:
            ct2.translate_plain(translator, ct2_dir, batch, beam, 1.0, a, b, batch_size=size, min_length=not args.teacher)

        timing = (args.batch, args.device, args.repeats, args.latency_repeats)
        out: dict[str, Any] = {name: _time(lambda batch, size, beam=beam: plain(batch, size, beam), sequences, *timing)
                               for name, beam in (("greedy", 1), ("beam4", 4))}
        if args.mirror:
            out["mirror_beam4"] = _time(lambda batch, size: ct2.translate_ids(translator, ct2_dir, batch, 4, 1.0, a, b,
                                                                            batch_size=size), sequences, *timing)
        if device == "cpu":  # equal precision against REDER's greedy_int8
            translator = ct2.load_translator(ct2_dir, device=device, threads=args.threads, compute_type="int8")
            out["greedy_int8"] = _time(lambda batch, size: plain(batch, size, 1), sequences, *timing)
    out["version"] = ctranslate2.__version__
    return out


def worker(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    spm = spm_model(args)
    sequences = sources(args, spm)
    # no_grad, not inference_mode: weights made under inference mode have no version counter, and the fast path
    # then checks them by a hash at every call (reder.runtime.onednn.stamp); the decoders run in inference mode anyway
    with torch.no_grad():
        if args.worker == "reder":
            return work_reder(args, sequences, args.vocab)
        if args.worker == "teacher":
            return work_teacher(args, sequences, args.vocab)
        return work_ct2(args, sequences, args.vocab, spm)


def _ratios(engines: dict[str, Any]) -> dict[str, float]:
    """Every REDER decoder's speed-up over every AR decoder: batch-1 latency and batch sentences/s."""
    ratios = {}
    for ours, our_numbers in engines.get("reder", {}).items():
        if not isinstance(our_numbers, dict) or "latency_ms" not in our_numbers:
            continue
        for engine in ("teacher", "ct2"):
            for theirs, numbers in engines.get(engine, {}).items():
                if isinstance(numbers, dict) and "latency_ms" in numbers:
                    ratios[f"reder_{ours}_vs_{engine}_{theirs}_batch1"] = round(numbers["latency_ms"] / our_numbers["latency_ms"], 2)
                    ratios[f"reder_{ours}_vs_{engine}_{theirs}_batchN"] = round(
                        our_numbers["sentences_per_s"] / numbers["sentences_per_s"], 2)
    return ratios


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return {}
    spm_model(args)  # trained once, before the workers
    engines: dict[str, Any] = {}
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
    loads: dict[str, Any] = {}
    for engine in args.engines.split(","):
        if engine == "ct2" and importlib.util.find_spec("ctranslate2") is None:
            engines[engine] = {"skipped": "CTranslate2 is not installed (pip install -e '.[ct2]')"}
            continue
        loads[f"{engine}_before"] = [round(x, 2) for x in os.getloadavg()]
        done = subprocess.run([sys.executable, "-m", "bench.peers", *forwarded, "--worker", engine], cwd=REPO_ROOT,
                              capture_output=True, text=True)
        if done.returncode != 0:  # the other engines' numbers still come out; the run then exits 1
            print(f"bench.peers: the {engine} worker failed:\n{done.stderr[-3000:]}", file=sys.stderr)
            engines[engine] = {"failed": done.stderr[-3000:]}
        else:
            engines[engine] = json.loads(done.stdout.strip().splitlines()[-1])
        loads[f"{engine}_after"] = [round(x, 2) for x in os.getloadavg()]
    report = {"benchmark": "peers", "device": args.device, "threads": args.threads, "sentences": args.sentences,
              "batch": args.batch, "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
              "cores": os.cpu_count(), "models": "given" if args.reder or args.teacher else
              f"untrained d{args.d_model} h{args.heads} ffn{args.ffn} layers {args.layers} vocab {args.vocab}"
              f"; AR outputs forced to {args.ar_tokens} tokens",
              "load_average": loads, "engines": engines, "ratios": _ratios(engines)}
    emit(report, args.out)
    failed = [engine for engine, numbers in engines.items() if "failed" in numbers]
    if failed:
        raise SystemExit(f"bench.peers: the {', '.join(failed)} worker(s) failed (above; the report holds the others)")
    return report


if __name__ == "__main__":
    main()
