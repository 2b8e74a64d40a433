"""The AR teacher's batched beam search (`Transformer.beam_search`, what distillation and the teachers' beam 4
run): its sentences/s, and how its seconds split between the network (encoder, the decoder cache's start, the
decoder steps) and the search's own work around it (top-k, reordering the cache, keeping the finished
hypotheses and deciding which sentences stop).

    python -m bench.beam_search --teachers DIR [--sentences 2000] [--beam 4] [--max-tokens 8192] [--threads 1]
        [--repeats 3] [--no-split] [--out FILE]

`--teachers`: a finished teacher stage, or a directory `python -m bench.distill --keep-teachers DIR
--train-steps N` wrote (trained teachers end their sentences as real ones do). Input: the first `--sentences`
Multi30k training pairs, each direction decoded in `distill.plan_batches` batches of `--max-tokens` (the distill
stage's batches), on the GPU when there is one. `split` (on by default; a CPU measurement: each network call is
timed as it returns, which on a GPU would add a device synchronisation per call) gives `network_s` and
`search_s` = wall − network, the median of `--repeats` passes, and `outputs_sha256` (every hypothesis, both
directions) so that two versions of the search can be checked to give the same outputs. `item_calls` and
`tolist_calls`: how often one pass read a tensor's values back to Python (`Tensor.item`, `Tensor.tolist`, counted
on the class), each a wait for the device on a GPU; the same count on any device.
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


def _timed(function: Callable, spent: list[float]) -> Callable:
    def call(*args: Any, **kwargs: Any) -> Any:
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
             split: bool) -> tuple[float, float, list[list[int]], dict[str, int]]:
    """(wall seconds, network seconds, outputs, read-backs by method) of decoding every direction's inputs once."""
    from pipeline.stages import distill

    spent = [0.0]
    for model in models.values():
        for name in ("encode", "start", "step"):  # instance attributes: the search's `self.<name>` finds them
            if split:
                setattr(model, name, _timed(getattr(type(model), name).__get__(model), spent))
            elif name in vars(model):
                delattr(model, name)
    outputs: list[list[int]] = []
    calls = {"item": 0, "tolist": 0}
    methods = {name: getattr(torch.Tensor, name) for name in calls}
    for name in calls:
        setattr(torch.Tensor, name, _counted(name, calls))
    try:
        started = time.perf_counter()
        for direction, model in models.items():
            outputs += distill.decode(model, inputs[direction], direction, beam, 1.0, 1.2, 10, max_tokens=max_tokens)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
    finally:
        for name, method in methods.items():
            setattr(torch.Tensor, name, method)
    return wall, spent[0], outputs, calls


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teachers", required=True, help="a teacher stage directory (teachers.json)")
    parser.add_argument("--data-dir", default=str(MULTI30K))
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8192)
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
    english, german = ((data / f"train.{lang}").read_text(encoding="utf-8").splitlines()[: args.sentences]
                       for lang in ("en", "de"))
    inputs = {"src2tgt": sp.encode(english), "tgt2src": sp.encode(german)}
    models = {d: load_teacher_dir(dirs[d], d, sp.get_piece_size(), device) for d in ("src2tgt", "tgt2src")}
    split = not args.no_split
    one_pass(models, {d: x[:32] for d, x in inputs.items()}, args.beam, args.max_tokens, split)  # warm-up
    passes = [one_pass(models, inputs, args.beam, args.max_tokens, split) for _ in range(args.repeats)]
    wall = statistics.median(p[0] for p in passes)
    network = statistics.median(p[1] for p in passes) if split else None
    outputs = passes[0][2]
    if any(p[2] != outputs for p in passes):
        raise SystemExit("error: the passes' outputs differ")
    decodes = 2 * len(english)
    report = {"benchmark": "beam_search", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "threads": args.threads,
              "load_average": os.getloadavg()[0], "teachers": str(args.teachers), "decodes": decodes,
              "beam": args.beam, "max_tokens": args.max_tokens, "repeats": args.repeats,
              "mean_output_pieces": round(sum(map(len, outputs)) / decodes, 2),
              "wall_s": round(wall, 3), "sentences_per_s": round(decodes / wall, 1),
              "network_s": None if network is None else round(network, 3),
              "search_s": None if network is None else round(wall - network, 3),
              "search_ms_per_1000_sentences": None if network is None else round(1e6 * (wall - network) / decodes, 1),
              "item_calls": passes[0][3]["item"], "tolist_calls": passes[0][3]["tolist"],
              "outputs_sha256": hashlib.sha256(json.dumps(outputs).encode()).hexdigest()}
    return emit(report, args.out)


if __name__ == "__main__":
    main()
