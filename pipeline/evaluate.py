"""Evaluate stage: decode valid/test in both directions, score with sacreBLEU, time the decoders.

For each split in `evaluate.splits` (the ingested text, encoded with the run's SentencePiece model) and
each direction: greedy CTC decoding and (beam_size > 1) CTC prefix beam search — for a DAG model (head "dag")
its greedy, lookahead and Viterbi decoders instead; detokenized hypotheses are
written to `<split>.<direction>.<decoder>.txt` and scored against the original text with sacreBLEU's BLEU
and chrF (signatures recorded). Round trip: x → ŷ → x̂ and y → x̂ → ŷ (greedy), scored against x and y.
Speed: per-sentence latency at batch 1 and sentences/s at batch `throughput_batch`, on the test split.

`results.json` holds the headline numbers (test split, greedy): `bleu_src2tgt`, `bleu_tgt2src`,
`chrf_src2tgt`, `chrf_tgt2src`, `roundtrip_bleu_src`, `roundtrip_bleu_tgt`, the signatures, the MLflow
run id, and every (split, direction, decoder) score under `scores`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import sacrebleu
import torch

from pipeline import ingest, train
from pipeline.config import PipelineConfig
from pipeline.stage import require_done, run_stage, stage_dir, write_json, write_text
from reder import DIRECTIONS, EOS_ID
from reder.checkpoint import SPM_FILE, load_model_dir
from reder.dag import DAG_DECODERS
from reder.translate import encode_lines, translate_ids

log = logging.getLogger(__name__)

RESULTS_FILE = "results.json"


def output_dir(cfg: PipelineConfig, workdir: Path) -> Path:
    return stage_dir(workdir, "evaluate", {"evaluate": asdict(cfg.evaluate), "train": train.output_dir(cfg, workdir).name,
                                           "ingest": ingest.output_dir(cfg, workdir).name})


def run(cfg: PipelineConfig, workdir: Path, force: bool = False, tracker: Any = None) -> Path:
    workdir = Path(workdir).resolve()
    model_dir = require_done(train.output_dir(cfg, workdir), "train") / train.MODEL_DIR
    corpus = require_done(ingest.output_dir(cfg, workdir), "ingest")
    run_id = tracker.run_id if tracker is not None else None
    return run_stage("evaluate", output_dir(cfg, workdir),
                     lambda tmp: evaluate_model(model_dir, corpus, cfg, tmp, run_id),
                     config=asdict(cfg.evaluate), inputs={"model": str(model_dir), "ingest": str(corpus)}, force=force)


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """sacreBLEU BLEU and chrF of detokenized hypotheses against one reference each, with signatures."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    return {"bleu": bleu.corpus_score(hypotheses, [references]).score, "bleu_signature": str(bleu.get_signature()),
            "chrf": chrf.corpus_score(hypotheses, [references]).score, "chrf_signature": str(chrf.get_signature())}


def read_text_split(corpus: Path, split: str, limit: int = 0) -> tuple[list[str], list[str]]:
    """The ingested (src, tgt) text of a split, in id order."""
    table = pq.read_table(corpus / split).sort_by("id")
    if limit:
        table = table.slice(0, limit)
    return table.column("src").to_pylist(), table.column("tgt").to_pylist()


def evaluate_model(model_dir: Path, corpus: Path, cfg: PipelineConfig, out: Path, mlflow_run_id: str | None) -> dict:
    """Decode, score and time (see module doc); writes results.json and the hypotheses into `out`."""
    import sentencepiece

    evaluation = cfg.evaluate
    model, meta = load_model_dir(model_dir, "cuda" if torch.cuda.is_available() else "cpu")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_FILE))
    decoders = {"greedy": 1, **({f"beam{evaluation.beam_size}": evaluation.beam_size} if evaluation.beam_size > 1 else {})}
    if model.cfg.head == "dag":  # DAG models: their own decoders, no beam (beam_size is CTC's)
        decoders = {name: 1 for name in DAG_DECODERS}
    scores: dict[str, Any] = {}
    signatures: dict[str, str] = {}
    roundtrip: dict[str, Any] = {}
    for split in evaluation.splits:
        src_text, tgt_text = read_text_split(corpus, split, evaluation.max_sentences)
        sides = {"src2tgt": (src_text, tgt_text), "tgt2src": (tgt_text, src_text)}
        greedy_ids = {}
        for direction, (inputs, references) in sides.items():
            encoded = encode_lines(sp, inputs)
            for decoder, beam in decoders.items():
                started = time.perf_counter()
                ids = translate_ids(model, encoded, direction, beam, evaluation.batch_size, _decoder(decoder))
                seconds = time.perf_counter() - started
                hypotheses = [sp.decode(h) for h in ids]
                write_text(out / f"{split}.{direction}.{decoder}.txt", "".join(h + "\n" for h in hypotheses))
                result = corpus_scores(hypotheses, references)
                signatures.update(bleu=result.pop("bleu_signature"), chrf=result.pop("chrf_signature"))
                scores[f"{split}.{direction}.{decoder}"] = {**result, "sentences": len(ids), "seconds": round(seconds, 3)}
                log.info("evaluate %s %s %s: BLEU %.2f chrF %.2f (%d sentences, %.1f s)", split, direction, decoder,
                         result["bleu"], result["chrf"], len(ids), seconds)
                if decoder == "greedy":
                    greedy_ids[direction] = ids
        for direction, (inputs, _) in sides.items():  # x -> ŷ -> x̂, scored against x
            back = "tgt2src" if direction == "src2tgt" else "src2tgt"
            restored = translate_ids(model, [h + [EOS_ID] for h in greedy_ids[direction]], back, 1, evaluation.batch_size)
            side = "src" if direction == "src2tgt" else "tgt"
            text = [sp.decode(h) for h in restored]
            write_text(out / f"{split}.roundtrip_{side}.greedy.txt", "".join(h + "\n" for h in text))
            roundtrip[f"{split}.{side}"] = corpus_scores(text, inputs)["bleu"]
    headline_split = "test" if "test" in evaluation.splits else evaluation.splits[0]
    results: dict[str, Any] = {"split": headline_split, "decoder": "greedy"}
    for direction in DIRECTIONS:
        entry = scores[f"{headline_split}.{direction}.greedy"]
        results[f"bleu_{direction}"], results[f"chrf_{direction}"] = entry["bleu"], entry["chrf"]
    results.update(roundtrip_bleu_src=roundtrip[f"{headline_split}.src"], roundtrip_bleu_tgt=roundtrip[f"{headline_split}.tgt"],
                   bleu_signature=signatures["bleu"], chrf_signature=signatures["chrf"], mlflow_run_id=mlflow_run_id,
                   model_dir=str(model_dir), src_lang=meta["src_lang"], tgt_lang=meta["tgt_lang"], scores=scores,
                   roundtrip=roundtrip)
    src_text, _ = read_text_split(corpus, headline_split, evaluation.max_sentences)
    results["speed"] = measure_speed(model, encode_lines(sp, src_text), decoders, evaluation)
    write_json(out / RESULTS_FILE, results)
    return {k: results[k] for k in ("bleu_src2tgt", "bleu_tgt2src", "chrf_src2tgt", "chrf_tgt2src",
                                    "roundtrip_bleu_src", "roundtrip_bleu_tgt")}


def measure_speed(model: Any, encoded: list[list[int]], decoders: dict[str, int], evaluation: Any) -> dict[str, Any]:
    """Latency (ms per sentence, batch 1, mean and p90) and throughput (sentences/s at a large batch)."""
    speed: dict[str, Any] = {"device": str(next(model.parameters()).device), "threads": torch.get_num_threads(),
                             "direction": "src2tgt"}
    single = encoded[: evaluation.latency_sentences]
    for decoder, beam in decoders.items():
        if single:
            translate_ids(model, single[:2], "src2tgt", beam, 1, _decoder(decoder))  # warm-up
            times = []
            for sequence in single:
                started = time.perf_counter()
                translate_ids(model, [sequence], "src2tgt", beam, 1, _decoder(decoder))
                times.append(time.perf_counter() - started)
            times.sort()
            speed[f"{decoder}_latency_ms"] = round(1000 * sum(times) / len(times), 3)
            speed[f"{decoder}_latency_p90_ms"] = round(1000 * times[int(0.9 * (len(times) - 1))], 3)
        started = time.perf_counter()
        translate_ids(model, encoded, "src2tgt", beam, evaluation.throughput_batch, _decoder(decoder))
        speed[f"{decoder}_sentences_per_s"] = round(len(encoded) / (time.perf_counter() - started), 2)
    return speed


def _decoder(name: str) -> str:
    """translate_ids' `decoder` for a decoder name: a DAG decoder by its own name; CTC's are greedy + beam size."""
    return name if name in DAG_DECODERS else "greedy"
