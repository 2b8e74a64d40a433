"""The AR teacher's batched beam search (`Transformer.beam_search`, what distillation and the teachers' beam 4
run): its sentences/s, its decoder steps, and how its seconds split between the network (encoder, the decoder
cache's start, the decoder steps) and the search's own work around it (top-k, reordering the cache, keeping the
finished hypotheses and deciding which sentences stop).

    python -m bench.beam_search --teachers DIR [--subset train] [--sentences 2000] [--beam 4]
        [--max-tokens 8192 [32768 ...]] [--batch-size 128] [--threads 1] [--repeats 3] [--no-split] [--out FILE]

`--teachers`: a finished teacher stage, or a directory `python -m bench.distill --keep-teachers DIR
--train-steps N` wrote (trained teachers end their sentences as real ones do). Input: the first `--sentences`
pairs of Multi30k's `--subset` (0: all of them), each direction decoded in `distill.plan_batches` batches of
`--max-tokens` padded source pieces (the distill stage's batches; 0: length-sorted batches of `--batch-size`
sentences, as the evaluate stage decodes; several values: each measured in turn, their outputs checked to be the
same), on the GPU when there is one. `--beam 1` is greedy. Per value, under `runs`: `batches` (one search
each), `decoder_steps` (decoder calls, each over the batch's live hypotheses: where a step's cost is its kernel
launches and not its arithmetic, as on a GPU at these sizes, the search's time goes with this count),
`ms_per_step`, and unless `--no-split` (a CPU measurement: each network call is timed as it returns, which on a
GPU would add a device synchronisation per call) `network_s` and `search_s` = wall − network, the median of
`--repeats` passes. `aten_ops_per_step`: the tensor operations a step dispatches (network and search; on a GPU
about one kernel launch each), counted over one search of each direction's first 64 sentences. `item_calls` and
`tolist_calls`: how often one pass read a tensor's values back to Python (`Tensor.item`, `Tensor.tolist`, counted
on the class), each a wait for the device on a GPU; the same count on any device.
`outputs_sha256` (every hypothesis, both directions) checks that two versions of the search give the same outputs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from bench import MULTI30K, emit


def _wrapped(function: Callable, spent: list[float] | None, calls: dict[str, int], name: str) -> Callable:
    """`function`, counted in `calls[name]` and, with `spent`, its seconds added to `spent[0]`."""
    def call(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        if spent is None:
            return function(*args, **kwargs)
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started
    return call


def _counted(name: str, calls: dict[str, int]) -> Callable:
    method = getattr(torch.Tensor, name)

    def call(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return method(self, *args, **kwargs)
    return call


def one_pass(models: dict[str, Any], inputs: dict[str, list[list[int]]], beam: int, max_tokens: int,
             timed: bool, batch_size: int = 128) -> tuple[float, float, list[list[int]], dict[str, int]]:
    """(wall seconds, network seconds, outputs, counts) of decoding every direction's inputs once; counts: the
    read-backs by method (`item`, `tolist`), the searches (`encode`: one per batch) and the decoder steps
    (`step`: one per decoder call, each the whole live batch)."""
    from pipeline.stages import distill

    spent = [0.0]
    calls = {"item": 0, "tolist": 0, "encode": 0, "start": 0, "step": 0}
    for model in models.values():
        for name in ("encode", "start", "step"):  # instance attributes: the search's `self.<name>` finds them
            setattr(model, name, _wrapped(getattr(type(model), name).__get__(model), spent if timed else None,
                                          calls, name))
    outputs: list[list[int]] = []
    methods = {name: getattr(torch.Tensor, name) for name in ("item", "tolist")}
    for name in methods:
        setattr(torch.Tensor, name, _counted(name, calls))
    try:
        started = time.perf_counter()
        for direction, model in models.items():
            outputs += distill.decode(model, inputs[direction], direction, beam, 1.0, 1.2, 10, max_tokens=max_tokens,
                                      batch_size=batch_size)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
    finally:
        for name, method in methods.items():
            setattr(torch.Tensor, name, method)
    return wall, spent[0], outputs, calls


def ops_per_step(models: dict[str, Any], inputs: dict[str, list[list[int]]], beam: int, sentences: int = 64) -> float:
    """The tensor operations (aten calls, as the dispatcher sees them: on a GPU each about one kernel launch) per
    decoder step of the search, the network's and the search's own, over one search of the first `sentences` of
    each direction."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    with Count():
        calls = one_pass(models, {d: x[:sentences] for d, x in inputs.items()}, beam, 0, False, sentences)[3]
    return Count.calls / max(calls["step"], 1)


def measure(models: dict[str, Any], inputs: dict[str, list[list[int]]], beam: int, max_tokens: int, timed: bool,
            repeats: int, batch_size: int) -> tuple[dict[str, Any], list[list[int]]]:
    """One `--max-tokens` value: its figures (the median of `repeats` passes) and the outputs."""
    passes = [one_pass(models, inputs, beam, max_tokens, timed, batch_size) for _ in range(repeats)]
    wall = statistics.median(p[0] for p in passes)
    network = statistics.median(p[1] for p in passes) if timed else None
    outputs, calls = passes[0][2], passes[0][3]
    if any(p[2] != outputs for p in passes):
        raise SystemExit("error: the passes' outputs differ")
    decodes = len(outputs)
    return {"max_tokens": max_tokens, **({} if max_tokens else {"batch_size": batch_size}),
            "batches": calls["encode"], "decoder_steps": calls["step"],
            "wall_s": round(wall, 3), "sentences_per_s": round(decodes / wall, 1),
            "ms_per_step": round(1e3 * wall / max(calls["step"], 1), 3),
            "network_s": None if network is None else round(network, 3),
            "search_s": None if network is None else round(wall - network, 3),
            "search_ms_per_1000_sentences": None if network is None else round(1e6 * (wall - network) / decodes, 1),
            "item_calls": calls["item"], "tolist_calls": calls["tolist"]}, outputs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teachers", required=True, help="a teacher stage directory (teachers.json)")
    parser.add_argument("--data-dir", default=str(MULTI30K))
    parser.add_argument("--subset", default="train", help="the file stem of the pairs: train, test_2016_flickr, ...")
    parser.add_argument("--sentences", type=int, default=2000, help="the first N pairs; 0: all")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[8192], help="0: --batch-size sentences")
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per search with --max-tokens 0")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on a CPU")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-split", action="store_true", help="time the whole search only (for a GPU)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import sentencepiece

    from pipeline.stages import teacher
    from reder.checkpoint import SPM_FILE, load_teacher_dir

    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dirs = teacher.model_dirs(Path(args.teachers))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(dirs["src2tgt"] / SPM_FILE))
    data = Path(args.data_dir)
    english, german = ((data / f"{args.subset}.{lang}").read_text(encoding="utf-8").splitlines()
                       [: args.sentences or None] for lang in ("en", "de"))
    inputs = {"src2tgt": sp.encode(english), "tgt2src": sp.encode(german)}
    models = {d: load_teacher_dir(dirs[d], d, sp.get_piece_size(), device) for d in ("src2tgt", "tgt2src")}
    timed = not args.no_split
    one_pass(models, {d: x[:32] for d, x in inputs.items()}, args.beam, args.max_tokens[0], timed)  # warm-up
    runs, outputs = [], None
    for max_tokens in args.max_tokens:
        run, found = measure(models, inputs, args.beam, max_tokens, timed, args.repeats, args.batch_size)
        if outputs is not None and found != outputs:  # an output does not depend on its batch
            raise SystemExit(f"error: the outputs at --max-tokens {max_tokens} differ from those at "
                             f"{args.max_tokens[0]}")
        runs.append(run)
        outputs = found
    assert outputs is not None
    decodes = 2 * len(english)
    report = {"benchmark": "beam_search", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "threads": args.threads,
              "load_average": os.getloadavg()[0], "teachers": str(args.teachers), "subset": args.subset,
              "decodes": decodes, "beam": args.beam, "repeats": args.repeats,
              "mean_output_pieces": round(sum(map(len, outputs)) / decodes, 2),
              "aten_ops_per_step": round(ops_per_step(models, inputs, args.beam), 1), "runs": runs,
              "outputs_sha256": hashlib.sha256(json.dumps(outputs).encode()).hexdigest()}
    return emit(report, args.out)


if __name__ == "__main__":
    main()
