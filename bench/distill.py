"""Knowledge-distillation decoding speed: the distill stage on Ray Data with 1 and 2 CPU actors against the
teacher's batched beam search in one process (on the GPU when there is one), batched by sentences and by tokens.

    python -m bench.distill [--teachers <workdir>/teacher-<hash>] [--sentences 500] [--batch-sizes 32 128 512]
        [--max-tokens 2048 8192] [--ray-max-tokens 8192] [--keep-teachers DIR]

Prints one JSON object. Input: the first `--sentences` pairs of Multi30k train (../shared/data/multi30k),
both directions decoded (so 2 × sentences decodes per measurement), beam `--beam` (4, as for KD).
Teachers: a finished teacher stage (`--teachers`, its spm.model tokenizes the input; a directory that
`--keep-teachers` wrote is one), else randomly initialised teachers of `--d-model/--layers/--ffn-dim` with a
SentencePiece model trained on the input (`teachers: random`): a random teacher never ends a sentence early,
so every output runs to the length cap (1.2·|x| + 10) — more decoding steps than a trained teacher needs, an
upper bound on the work; `--train-steps N` first trains them N updates on all of Multi30k train (realistic
output lengths; on a GPU). `training_bleu` scores the decoded (training) sentences against their references:
a sanity check only.
- `direct_batch<B>`: `distill.decode` in this process (all its threads), both directions, length-sorted
  batches of B sentences (`distill.max_tokens=0 distill.batch_size=B`), sentences/s (device in `device`).
- `direct_tokens<T>`: the same, batches of at most T padded source pieces (`distill.max_tokens=T`).
- `ray_actors1`, `ray_actors2`: `distill.distill_on_ray` on CPU (Ray already running; actor start included)
  with `distill.max_tokens=--ray-max-tokens` (0: `batch_size=--ray-batch-size`), sentences/s, its time over
  the in-process time of the same batches (`over_direct`, when measured), and whether its outputs are those
  (`identical_to_direct`).
With `--engine both` (the default when CTranslate2 is installed) the same measurements through CTranslate2
(`distill.engine=ctranslate2`: the teachers converted by `distill.convert_teachers`, decoded by
`reder.ct2.translate_ids`, which mirrors our search) under `ct2_…`, the speed-ups `ct2_speedup_…`, and
`ct2_identical_outputs`: the fraction of CTranslate2 outputs equal to ours (first batching).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import torch

from bench import MULTI30K


def _spm(lines: list[str], work: Path, vocab_size: int) -> Path:
    """The pipeline's joint SentencePiece model (special ids, blank last) trained on `lines`."""
    from pipeline.stages import spm

    (work / "spm.model").write_bytes(spm.train(lines, vocab_size, num_threads=os.cpu_count() or 1))
    return work / "spm.model"


def _random_teachers(work: Path, spm_model: Path, args: argparse.Namespace) -> dict[str, str]:
    from reder import TransformerConfig
    from reder.autoregressive import Transformer
    from reder.checkpoint import save_model_dir

    dirs = {}
    for direction in ("src2tgt", "tgt2src"):
        model = Transformer(TransformerConfig(vocab_size=args.vocab_size, d_model=args.d_model, n_heads=args.heads,
                                              ffn_dim=args.ffn_dim, encoder_layers=args.layers,
                                              decoder_layers=args.layers, dropout=0.0))
        dirs[direction] = str(save_model_dir(work / direction, model, spm_model, "en", "de", extra={"direction": direction}))
    return dirs


def _train(dirs: dict[str, str], english: list[list[int]], german: list[list[int]], steps: int, max_tokens: int,
           device: str) -> dict[str, float]:
    """Train each random teacher `steps` updates on the (English, German) pairs in its direction (so it ends
    sentences as a real teacher does) with the pipeline's training core and recipe (lr 7e-4, 1,000 warm-up
    updates) and save it back; returns the last training loss per direction."""
    from pipeline.config import TrainConfig
    from pipeline.training.harness import Harness
    from reder.objectives.directional import TeacherObjective
    from reder.checkpoint import load_model_dir, save_model_dir

    train = TrainConfig(max_steps=steps, lr=7e-4, warmup_steps=1000, max_tokens=max_tokens)
    examples, losses = list(zip(english, german)), {}
    for direction, directory in dirs.items():
        model, meta = load_model_dir(Path(directory), device)
        fitted = Harness(model, TeacherObjective(model, direction), train, device).fit_examples(examples)
        losses[direction] = fitted["last_loss"]
        save_model_dir(Path(directory), model.cpu(), Path(directory) / "spm.model", meta["src_lang"],
                       meta["tgt_lang"], extra={"direction": direction})
    return losses


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(MULTI30K))
    parser.add_argument("--teachers", default="", help="a finished teacher stage directory (teachers.json)")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--max-tokens", type=int, nargs="*", default=[8192],
                        help="in-process: also batches of at most this many padded source pieces")
    parser.add_argument("--ray-max-tokens", type=int, default=8192, help="distill.max_tokens on Ray (0: by sentences)")
    parser.add_argument("--ray-batch-size", type=int, default=128, help="distill.batch_size on Ray (with max tokens 0)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray measurements")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn-dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=0,
                        help="random teachers: train them this many updates on all of Multi30k train first")
    parser.add_argument("--keep-teachers", default="",
                        help="random teachers: also save them here (with teachers.json), for a later --teachers")
    parser.add_argument("--train-tokens", type=int, default=8192, help="tokens per training batch")
    parser.add_argument("--engine", choices=("torch", "ctranslate2", "both"), default="",
                        help="distill engine(s) to measure (default: both when CTranslate2 is installed, else torch)")
    args = parser.parse_args(argv)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import sacrebleu
    import sentencepiece

    from pipeline.stages import distill, teacher, tokenize
    from pipeline.config import DistillConfig
    from reder.checkpoint import SPM_FILE, load_teacher_dir

    data = Path(args.data_dir)
    all_english = (data / "train.en").read_text(encoding="utf-8").splitlines()
    all_german = (data / "train.de").read_text(encoding="utf-8").splitlines()
    english, german = all_english[: args.sentences], all_german[: args.sentences]
    work = Path(tempfile.mkdtemp(prefix="bench-distill-"))
    try:
        if args.teachers:
            dirs = {d: str(p) for d, p in teacher.model_dirs(Path(args.teachers)).items()}
            spm_model = Path(dirs["src2tgt"]) / SPM_FILE
        else:
            spm_model = _spm(all_english + all_german, work, args.vocab_size)
            dirs = _random_teachers(work, spm_model, args)
        sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        trained = {}
        if args.train_steps and not args.teachers:
            every_en, every_de = sp.encode(all_english), sp.encode(all_german)
            started = time.perf_counter()
            trained = _train(dirs, every_en, every_de, args.train_steps, args.train_tokens, device)
            trained["seconds"] = round(time.perf_counter() - started, 1)
        if args.keep_teachers and not args.teachers:  # as a teacher stage lays them out: --teachers reads them
            kept = Path(args.keep_teachers)
            for direction, directory in dirs.items():
                shutil.copytree(directory, kept / direction, dirs_exist_ok=True)
            (kept / teacher.TEACHERS_FILE).write_text(json.dumps({d: d for d in dirs}), encoding="utf-8")
        vocab_size = sp.get_piece_size() if args.teachers else args.vocab_size
        src, tgt = sp.encode(english), sp.encode(german)
        ids = pa.list_(pa.int32())
        table = pa.table({"id": pa.array(range(len(src)), pa.int64()), "src_ids": pa.array(src, ids),
                          "tgt_ids": pa.array(tgt, ids), "src_len": pa.array(map(len, src), pa.int32()),
                          "tgt_len": pa.array(map(len, tgt), pa.int32())}, schema=tokenize.SCHEMA)
        report: dict = {"benchmark": "distill", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        "machine": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                        "load_average": os.getloadavg()[0],
                        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                        "teachers": args.teachers or ("random, trained %d steps" % args.train_steps if trained else "random"),
                        "teacher_training_loss": trained or None, "sentences": len(src), "decodes_per_run": 2 * len(src),
                        "beam": args.beam}
        decoding = {"beam_size": args.beam, "length_penalty": 1.0, "max_len_a": 1.2, "max_len_b": 10}
        engines = {"torch": ["torch"], "ctranslate2": ["ctranslate2"], "both": ["torch", "ctranslate2"],
                   "": ["torch", "ctranslate2"] if distill.ctranslate2_installed() else ["torch"]}[args.engine]
        report["engines"] = engines
        converted = distill.convert_teachers({d: Path(p) for d, p in dirs.items()}, work / "ct2") \
            if "ctranslate2" in engines else None
        report["teacher_parameters"] = sum(p.numel() for p in load_teacher_dir(Path(dirs["src2tgt"]), "src2tgt",
                                                                              vocab_size, "cpu").parameters())
        batchings = {**{f"batch{b}": {"max_tokens": 0, "batch_size": b} for b in args.batch_sizes},
                     **{f"tokens{t}": {"max_tokens": t, "batch_size": 1} for t in args.max_tokens}}
        ray_batching = f"tokens{args.ray_max_tokens}" if args.ray_max_tokens else f"batch{args.ray_batch_size}"
        first_outputs: dict[str, list] = {}
        direct_outputs: dict[tuple[str, str], list] = {}
        for engine in engines:
            decoder = distill.TeacherDecoder(dirs, vocab_size, decoding, threads=torch.get_num_threads(),  # as an actor has it
                                             ct2_dirs=converted if engine == "ctranslate2" else None)
            prefix = "ct2_" if engine == "ctranslate2" else ""
            for name, batching in batchings.items():
                decoder.decoders["src2tgt"](src[: min(8, len(src))], **batching, **decoding)  # warm-up
                if device == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                outputs = decoder.decoders["src2tgt"](src, **batching, **decoding)
                outputs += decoder.decoders["tgt2src"](tgt, **batching, **decoding)
                if device == "cuda":
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - started
                first_outputs.setdefault(engine, outputs)
                direct_outputs[engine, name] = outputs
                report[f"{prefix}direct_{name}"] = {"sentences_per_s": round(2 * len(src) / seconds, 2),
                                                    "seconds": round(seconds, 2),
                                                    "mean_output_pieces": round(sum(map(len, outputs)) / len(outputs), 2)}
                if "training_bleu" not in report:  # the decoded sentences are training pairs: a sanity check only
                    report["training_bleu"] = {
                        "src2tgt": round(sacrebleu.corpus_bleu(sp.decode(outputs[: len(src)]), [german]).score, 2),
                        "tgt2src": round(sacrebleu.corpus_bleu(sp.decode(outputs[len(src):]), [english]).score, 2)}
        if len(first_outputs) == 2:
            ours, theirs = first_outputs["torch"], first_outputs["ctranslate2"]
            report["ct2_identical_outputs"] = round(sum(a == b for a, b in zip(ours, theirs)) / len(ours), 4)
        if not args.no_ray:
            import ray

            started = time.perf_counter()
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
            report["ray_init_s"] = round(time.perf_counter() - started, 2)
            report["ray_batching"] = ray_batching
            for engine in engines:
                prefix = "ct2_" if engine == "ctranslate2" else ""
                for actors in (1, 2):
                    config = DistillConfig(workers=actors, max_tokens=args.ray_max_tokens, batch_size=args.ray_batch_size,
                                           **decoding)
                    started = time.perf_counter()
                    distilled, _ = distill.distill_on_ray(table, dirs, vocab_size, config,
                                                          converted if engine == "ctranslate2" else None)
                    seconds = time.perf_counter() - started
                    result = {"sentences_per_s": round(2 * len(src) / seconds, 2), "seconds": round(seconds, 2)}
                    direct = report.get(f"{prefix}direct_{ray_batching}")
                    if direct:
                        result["over_direct"] = round(seconds / direct["seconds"], 2)
                        outputs = distilled.column("kd_tgt_ids").to_pylist() + distilled.column("kd_src_ids").to_pylist()
                        result["identical_to_direct"] = outputs == direct_outputs[engine, ray_batching]
                    report[f"{prefix}ray_actors{actors}"] = result
                report[f"{prefix}ray_speedup_1_to_2_actors"] = round(
                    report[f"{prefix}ray_actors1"]["seconds"] / report[f"{prefix}ray_actors2"]["seconds"], 2)
            ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if "ctranslate2" in report.get("engines", []) and "torch" in report["engines"]:
        report["ct2_speedup"] = {key: round(report[f"ct2_{key}"]["sentences_per_s"] / report[key]["sentences_per_s"], 2)
                                 for key in list(report) if f"ct2_{key}" in report and isinstance(report[key], dict)}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
