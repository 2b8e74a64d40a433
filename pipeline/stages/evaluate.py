"""Evaluate stage: decode valid/test in both directions, score with sacreBLEU, time the decoders.

For each split in `evaluate.splits` (the ingested text, or a named test set of `evaluate.test_sets`: a pair of
local files or a sacreBLEU test set in its cache; encoded with the run's SentencePiece model) and
each direction: greedy CTC decoding and (beam_size > 1) CTC prefix beam search — for a DAG model (head "dag")
its greedy, lookahead and Viterbi decoders instead, and with beam_size > 1 its beam over strings (`beamK`) and its
beam over paths (`path_beamK`); every system a decoder of reder/decoding/; detokenized hypotheses are
written to `<split>.<direction>.<decoder>.txt` and scored against the original text with sacreBLEU's BLEU
and chrF (signatures recorded). Round trip: x → ŷ → x̂ and y → x̂ → ŷ (greedy), scored against x and y. Each
greedy translation's round-trip confidence (reder/confidence.py: the model's forward and read-back likelihoods)
goes into the translations table beside its sentence BLEU and chrF (`confidence_<direction>`), and its Spearman
correlation with sentence chrF (`confidence_spearman_<direction>`, a QE figure: does the score rank the
translations as their quality does) is a headline number beside BLEU.
Speed (`evaluate.measure_speed`): per-sentence latency at batch 1 and sentences/s at batch `throughput_batch`,
on the test split.

The autoregressive teachers (pipeline/stages/teacher.py) are the baseline: with `evaluate.teacher_baseline` each
direction's teacher decodes the same splits greedily (`teacher_greedy`) and with beam search
(`teacher_beamB`), scored and timed the same way, and `speed` gets REDER's speed-up over each teacher
decoder (`speedup_<decoder>_vs_<teacher decoder>`, from latency at batch 1 and from sentences/s). The
CTC beam (per-frame cutoffs `evaluate.cutoff_top_n`, `evaluate.cutoff_prob`) can be reranked
(`evaluate.rerank`): `teacher` rescores its candidates by the teacher of their direction (mean token
log-prob, all candidates of a batch in one teacher pass), decoder `beamK_rerank`; `self` by forward score +
`evaluate.rerank_weight` · the model's own reverse-direction log P(x | ŷ) (reder.rerank.self_rerank),
decoder `beamK_selfrerank`.

The CMLMs (pipeline/stages/cmlm.py, one per direction) give two more kinds of decoder: `cmlm_T<T>`, mask-predict with T
iterations for each T of `evaluate.cmlm_iterations` (`evaluate.cmlm_length_beam` length candidates), and
`greedy_refine<K>`, REDER's greedy output refined by K mask-predict iterations of the CMLM of its direction, for
each K of `evaluate.refine_steps`; they are scored and timed like the others.

A CTC model decodes greedily with the blank penalty its model directory records (tuned on the validation split
by the train stage, `evaluate.blank_penalties`); with a penalty other than 0, `greedy_unpenalised` is the greedy
decoder without it, for comparison. Each beam decoder (`beamK`, `beamK_selfrerank`, `beamK_rerank`) wants a
penalty of its own — the beam sums a hypothesis' alignments and its output runs longer than greedy's under
greedy's penalty — so with a grid other than [0] each is tuned here, per direction, on the validation split
(the sentences the train stage tuned greedy's on, `train.valid_max_sentences`): the grid point with the best
BLEU of that decoder's own output (`beam_blank_penalty`: decoder → direction → penalty, and each point's BLEU
under `beam_blank_penalty_valid`). A decoding setting chosen on validation, as fairseq users choose theirs;
`reder.translate --beam K --blank-penalty C` decodes the same.

`results.json` holds the headline numbers (test split, greedy), the blank penalties (`blank_penalty`,
`beam_blank_penalty`): `bleu_src2tgt`, `bleu_tgt2src`,
`chrf_src2tgt`, `chrf_tgt2src`, `roundtrip_bleu_src`, `roundtrip_bleu_tgt`, the signatures, the MLflow
run id, every (split, direction, decoder) score under `scores`, and each scored set's headline row under `sets`
(exact; MLflow gets `<set>_bleu_src2tgt`, ... for test and each named set, at two decimals). The round trip feeds
each greedy output back in, cut to the model's input limit where it is longer (`roundtrip_cut` counts them per
split and side); a test sentence longer than every decoder reads (the model's, the teachers' and CMLMs'
max_positions) is cut to it for all (`inputs_cut`, per split and direction).
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow.parquet as pq

from pipeline.config import NO_BLANK_PENALTY, PipelineConfig
from pipeline.metrics import HEADLINE, SHOWN_DECIMALS, best_setting, corpus_bleu, corpus_scores, sentence_scores, spearman, test_splits
from pipeline.progress import Progress
from pipeline.stage import StageError, StageRun, write_json, write_text
from pipeline.stages import cmlm, teacher
from pipeline.stages.ingest.readers import TextFile, TextRules
from pipeline.training.runfiles import MODEL_DIR
from reder.config import DIRECTIONS, EOS_ID

if TYPE_CHECKING:  # torch and the decoders are imported by the functions that decode: run_pipeline's driver loads
    import torch  # torch only when a stage that trains or decodes runs

log = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
# Per scored set, `<split>.json`: its columns source, reference (the tgt side), hypothesis_src2tgt, bleu_src2tgt,
# chrf_src2tgt, hypothesis_tgt2src (scored against source), bleu_tgt2src, chrf_tgt2src (greedy; sentence BLEU and
# chrF by sacreBLEU), one row a sentence pair: logged to MLflow as a table (mlflow.log_table) to sort by.
TRANSLATIONS_DIR = "translations"
# What every timing of this module reads (the decodes' `seconds`, measure_speed's latencies and throughputs):
# tests put a clock of known times here, so the speed-ups are checked against times they know.
clock: Callable[[], float] = time.perf_counter


def summary(output: Path, counts: dict[str, Any]) -> list[str]:
    """BLEU, chrF and round-trip BLEU of the test split, then a line per other scored set."""
    results = json.loads((output / RESULTS_FILE).read_text(encoding="utf-8"))
    lines = [f"{results['split']} ({results['decoder']}):  BLEU src2tgt {results['bleu_src2tgt']:.2f}  "
             f"tgt2src {results['bleu_tgt2src']:.2f}   chrF {results['chrf_src2tgt']:.1f} / "
             f"{results['chrf_tgt2src']:.1f}   round trip {results['roundtrip_bleu_src']:.1f} / "
             f"{results['roundtrip_bleu_tgt']:.1f}"]
    for name, row in results.get("sets", {}).items():
        if name != results["split"]:
            lines.append(f"{name} ({results['decoder']}):  BLEU src2tgt {row['bleu_src2tgt']:.2f}  tgt2src "
                         f"{row['bleu_tgt2src']:.2f}   chrF {row['chrf_src2tgt']:.1f} / {row['chrf_tgt2src']:.1f}")
    return lines


def build(run: StageRun, tmp: Path) -> dict[str, Any]:
    """Evaluate input `train`'s model on `ingest`'s splits (with input `teacher`'s models when the config
    asks for the baseline or reranking, input `cmlm`'s when it asks for the CMLM decoders) into `tmp`."""
    run_id = run.tracker.run_id if run.tracker is not None else None
    return evaluate_model(run.inputs["train"] / MODEL_DIR, run.inputs["ingest"], run.cfg, tmp, run_id,
                          run.inputs.get("teacher"), run.inputs.get("cmlm"))


def read_text_split(corpus: Path, split: str, limit: int = 0) -> tuple[list[str], list[str]]:
    """The ingested (src, tgt) text of a split, in id order."""
    table = pq.read_table(corpus / split).sort_by("id")
    if limit:
        table = table.slice(0, limit)
    return table.column("src").to_pylist(), table.column("tgt").to_pylist()


def test_set_files(spec: dict[str, str], src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """The (src_lang, tgt_lang) text files of an `evaluate.test_sets` entry: its own two files, or the source and
    reference files of a sacreBLEU test set in sacreBLEU's cache (never downloaded here: a StageError says how)."""
    if "sacrebleu" in spec:
        from sacrebleu.dataset import DATASETS

        name, pair = spec["sacrebleu"], spec.get("langpair", f"{src_lang}-{tgt_lang}")
        if name not in DATASETS:
            raise StageError(f"evaluate.test_sets: sacreBLEU has no test set {name!r}")
        if pair not in (pairs := DATASETS[name].langpairs):
            raise StageError(f"evaluate.test_sets: sacreBLEU's {name} has no language pair {pair} "
                             f"(it has {', '.join(sorted(pairs)) or 'none'})")
        if pair.split("-") not in ([src_lang, tgt_lang], [tgt_lang, src_lang]):
            raise StageError(f"evaluate.test_sets: {name}'s langpair {pair} is not {src_lang}-{tgt_lang} or "
                             f"{tgt_lang}-{src_lang}")
        dataset = DATASETS[name]
        # its text files, or the raw download they are made from (get_files makes them, downloading what is absent)
        texts = [Path(dataset._get_txt_file_path(pair, field)) for field in dataset.fieldnames(pair)]
        if not all(path.is_file() for path in texts) and not all(
                (Path(dataset._rawdir) / url.rsplit("/", 1)[-1]).is_file() for url in dataset.data or ()):
            raise StageError(f"evaluate.test_sets: sacreBLEU's {name} {pair} is not in its cache; fetch it once: "
                             f"sacrebleu -t {name} -l {pair} --echo src > /dev/null")
        files = (Path(dataset.get_source_file(pair)), Path(dataset.get_reference_files(pair)[0]))
        return files if pair.split("-") == [src_lang, tgt_lang] else files[::-1]
    files = (Path(spec["src"]), Path(spec["tgt"]))
    for path in files:
        if not path.is_file():
            raise StageError(f"evaluate.test_sets: {path}: no such file")
    return files


def read_test_set(spec: dict[str, str], src_lang: str, tgt_lang: str, limit: int = 0) -> tuple[list[str], list[str]]:
    """The (src, tgt) text of an `evaluate.test_sets` entry, line by line (the first `limit` lines; 0 = all). Read as
    ingest reads a corpus file (`TextFile`, strict: docs/USAGE.md, "Bad input"): a line ends at "\n" or "\r\n" only,
    a leading BOM is removed, and a control character, another line terminator, invalid UTF-8 or a UTF-16 file is
    an error naming file and line; a reference split elsewhere (`str.splitlines` split at U+2028, FF, NEL...)
    would misalign the pairs it is scored on."""
    sides = [list(TextFile(path, TextRules(), Counter()).lines()) for path in test_set_files(spec, src_lang, tgt_lang)]
    if len(sides[0]) != len(sides[1]):
        raise StageError(f"evaluate.test_sets {spec}: {len(sides[0])} source lines but {len(sides[1])} references")
    return (sides[0][:limit], sides[1][:limit]) if limit else (sides[0], sides[1])


def test_sets_key(cfg: PipelineConfig) -> dict[str, Any]:
    """`evaluate.test_sets` as the evaluate stage's key has it: each entry with the SHA-256 of its two files, so a
    changed file is a new evaluation (files of sets not listed in `splits` are not read)."""
    key = {}
    for name, spec in cfg.evaluate.test_sets.items():
        files = test_set_files(spec, cfg.data.src_lang, cfg.data.tgt_lang) if name in cfg.evaluate.splits else ()
        key[name] = {**spec, "sha256": [hashlib.sha256(path.read_bytes()).hexdigest() for path in files]}
    return key


def read_split(corpus: Path, split: str, cfg: PipelineConfig) -> tuple[list[str], list[str]]:
    """The (src, tgt) text that `split` names: an ingested split or an `evaluate.test_sets` entry."""
    limit = cfg.evaluate.max_sentences
    if split in cfg.evaluate.test_sets:
        return read_test_set(cfg.evaluate.test_sets[split], cfg.data.src_lang, cfg.data.tgt_lang, limit)
    return read_text_split(corpus, split, limit)


Decoder = Callable[[list[list[int]], str, int], list[list[int]]]  # (encoded inputs, direction, batch size) → ids


def system(models: dict[str, Any], decoders: dict[str, Any], refiners: dict[str, Any] | None = None,
           refine_steps: int = 0) -> Decoder:
    """An evaluated system: per direction a model and its decoder (reder/decoding/), maybe a refiner."""
    from reder.decoding.run import translate_ids

    return lambda encoded, direction, batch_size: translate_ids(
        models[direction], encoded, direction, decoders[direction], batch_size,
        (refiners or {}).get(direction), refine_steps)


def decoders_for(model: Any, evaluation: Any, teachers: dict[str, Any], cmlms: dict[str, Any] | None = None,
                 beam_penalty: dict[str, dict[str, float]] | None = None) -> dict[str, Decoder]:
    """Every evaluated system by name, each a decoder of reder/decoding/: REDER's (CTC greedy and beam, reranked
    by `evaluate.rerank`; or the DAG's greedy, lookahead, viterbi and beam; a beam decoder under its
    `beam_penalty` per direction where given, else the model's own), with `evaluate.teacher_baseline` the
    teachers' greedy and beam, and with `cmlms` (direction → CMLM) the CMLMs' mask_predict
    (`evaluate.cmlm_iterations`) and REDER's greedy output refined by them (`evaluate.refine_steps`)."""
    from reder.decoding import make_decoder

    if (evaluation.teacher_baseline or evaluation.rerank == "teacher") and set(teachers) != {"src2tgt", "tgt2src"}:
        raise ValueError("evaluate.teacher_baseline / evaluate.rerank=teacher need both directions' teachers "
                         "(the teacher stage's output)")
    cmlms = cmlms or {}
    iterations, refine_steps = getattr(evaluation, "cmlm_iterations", ()), getattr(evaluation, "refine_steps", ())
    if (iterations or refine_steps) and set(cmlms) != {"src2tgt", "tgt2src"}:
        raise ValueError("evaluate.cmlm_iterations / evaluate.refine_steps need both directions' CMLMs (the cmlm "
                         "stage's output)")
    reder = dict.fromkeys(DIRECTIONS, model)
    both = lambda decoder: dict.fromkeys(DIRECTIONS, decoder)  # noqa: E731
    greedy = head_decoder(model, evaluation, "greedy")
    systems: dict[str, Decoder] = {"greedy": system(reder, both(greedy))}
    for name in ("lookahead", "viterbi") if model.cfg.head == "dag" else ():
        systems[name] = system(reder, both(head_decoder(model, evaluation, name)))
    if any(getattr(model, "blank_penalty", {}).values()):
        systems["greedy_unpenalised"] = system(reder, both(make_decoder(model, "greedy", blank_penalty=0.0)))
    for name in beam_decoders(model, evaluation, teachers, "src2tgt"):
        chosen = (beam_penalty or {}).get(name, {})
        systems[name] = system(reder, {d: penalised(beam_decoders(model, evaluation, teachers, d)[name], chosen.get(d))
                                       for d in DIRECTIONS})
    for steps in refine_steps:
        systems[f"greedy_refine{steps}"] = system(reder, both(greedy), cmlms, steps)
    for count in iterations:
        mask_predict = make_decoder(cmlms["src2tgt"], "mask_predict", iterations=count,
                                    length_beam=evaluation.cmlm_length_beam)
        systems[f"cmlm_T{count}"] = system(cmlms, both(mask_predict))
    if evaluation.teacher_baseline:
        size = evaluation.teacher_beam_size
        systems["teacher_greedy"] = system(teachers, both(make_decoder(teachers["src2tgt"], "greedy")))
        systems[f"teacher_beam{size}"] = system(teachers, both(make_decoder(teachers["src2tgt"], "beam", beam_size=size)))
    return systems


def penalised(decoder: Any, penalty: float | None) -> Any:
    """A CTC decoder under blank penalty `penalty` (None: as it is, the model's own)."""
    return decoder if penalty is None else replace(decoder, blank_penalty=penalty)


def head_decoder(model: Any, evaluation: Any, name: str, **options: Any) -> Any:
    """REDER's decoder `name` with the evaluate section's options for its head: CTC the beam's per-frame cutoffs;
    DAG the transition bound, n-gram blocking (greedy, lookahead) and length penalty (viterbi, beam)."""
    from reder.decoding import make_decoder

    if model.cfg.head == "ctc":
        if name == "beam":
            options.update(cutoff_top_n=evaluation.cutoff_top_n, cutoff_prob=evaluation.cutoff_prob)
        return make_decoder(model, name, **options)
    options["max_transition"] = evaluation.dag_max_transition
    if name in ("greedy", "lookahead"):
        options["no_repeat_ngram"] = evaluation.dag_no_repeat_ngram
    else:
        options["length_penalty"] = evaluation.dag_length_penalty
    return make_decoder(model, name, **options)


def beam_decoders(model: Any, evaluation: Any, teachers: dict[str, Any], direction: str) -> dict[str, Any]:
    """REDER's beam decoders of `direction` by system name with `evaluate.beam_size` > 1: its beam search (CTC:
    prefix beam; DAG: over strings, `beamK`, and over paths and tokens, `path_beamK`) and, for a CTC model, the
    beam reranked by `evaluate.rerank`."""
    beam = evaluation.beam_size
    if beam < 2:
        return {}
    systems = {f"beam{beam}": head_decoder(model, evaluation, "beam", beam_size=beam)}
    if model.cfg.head == "dag":
        systems[f"path_beam{beam}"] = head_decoder(model, evaluation, "path_beam", beam_size=beam)
    if model.cfg.head == "ctc" and evaluation.rerank == "teacher":
        systems[f"beam{beam}_rerank"] = head_decoder(model, evaluation, "beam", beam_size=beam, rerank="teacher",
                                                     teacher=teachers[direction])
    elif model.cfg.head == "ctc" and evaluation.rerank == "self":
        systems[f"beam{beam}_selfrerank"] = head_decoder(model, evaluation, "beam", beam_size=beam, rerank="self",
                                                         rerank_weight=evaluation.rerank_weight)
    return systems


def tune_beam_penalties(model: Any, cfg: PipelineConfig, teachers: dict[str, Any], corpus: Path, sp: Any,
                        limit: int) -> dict[str, dict[str, dict[float, float]]]:
    """Validation BLEU of each beam decoder's output under each of `evaluate.blank_penalties`, per direction
    (decoder → direction → penalty → BLEU): the ingested valid split's first `train.valid_max_sentences`, inputs
    cut to `limit` pieces. The decoders share each penalty's n-best (`reranked_by_penalty`: the model run once per
    batch, the beam once per penalty). {} where there is nothing to tune (a DAG model, the grid [0], no beam)."""
    from reder.decoding.ctc import reranked_by_penalty
    from reder.decoding.run import encode_lines

    grid, evaluation = cfg.evaluate.blank_penalties, cfg.evaluate
    if evaluation.beam_size < 2 or not model.head.emits_blank or grid == NO_BLANK_PENALTY:
        return {}
    src, tgt = read_text_split(corpus, "valid", cfg.train.valid_max_sentences)
    sides = {"src2tgt": (src, tgt), "tgt2src": (tgt, src)}
    tuned: dict[str, dict[str, dict[float, float]]] = {}
    progress = Progress("evaluate, the beam's blank penalty on valid", len(sides) * len(src), "sentence")
    for direction, (inputs, references) in sides.items():
        progress.doing(f"valid {direction}: the beam under blank penalties {', '.join(f'{p:g}' for p in grid)}")
        encoded = cut_to([e[:-1] for e in encode_lines(sp, inputs)], limit)[0]
        outputs = reranked_by_penalty(model, encoded, direction, grid,
                                      beam_decoders(model, evaluation, teachers, direction), evaluation.batch_size,
                                      on_batch=lambda count: progress.update(progress.done + count))
        for penalty, by_name in outputs.items():
            for name, ids in by_name.items():
                tuned.setdefault(name, {}).setdefault(direction, {})[penalty] = \
                    corpus_bleu([sp.decode(h) for h in ids], references)[0]
    progress.close()
    return tuned


def cut_to(hypotheses: list[list[int]], limit: int) -> tuple[list[list[int]], int]:
    """Hypotheses (ids, no EOS) as inputs of at most `limit` pieces with EOS, and how many were cut: a degenerate
    output longer than the model reads (r·|x| frames can exceed max_positions / r) is cut rather than costing the
    stage; the round trip scores it as cut."""
    fed = [h[: limit - 1] + [EOS_ID] for h in hypotheses]
    return fed, sum(len(h) >= limit for h in hypotheses)


def evaluate_model(model_dir: Path, corpus: Path, cfg: PipelineConfig, out: Path, mlflow_run_id: str | None,
                   teacher_dir: Path | None = None, cmlm_dir: Path | None = None) -> dict:
    """Decode, score and time (see module doc); writes results.json and the hypotheses into `out`."""
    import sentencepiece
    import torch

    from reder.checkpoint import SPM_FILE, load_cmlm_dir, load_model_dir
    from reder.confidence import confidences
    from reder.decoding.run import encode_lines, translate_ids

    evaluation = cfg.evaluate
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, meta = load_model_dir(model_dir, device)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_FILE))
    teachers = {d: teacher.check_teacher(p, d, cfg, model_dir / SPM_FILE).to(device)
                for d, p in teacher.model_dirs(Path(teacher_dir)).items()} if teacher_dir else {}
    cmlms = {d: load_cmlm_dir(p, d, model.cfg.vocab_size, device) for d, p in cmlm.model_dirs(Path(cmlm_dir)).items()} \
        if cmlm_dir else {}
    # What every decoder reads: a test sentence longer than that is cut to it for all alike (inputs_cut counts).
    limit = min(m.max_input_length() for m in (model, *teachers.values(), *cmlms.values()))
    # Each beam decoder's own blank penalty, chosen on the validation split (see module doc).
    beam_valid = tune_beam_penalties(model, cfg, teachers, corpus, sp, limit)
    beam_penalty = {name: {d: best_setting(bleu) for d, bleu in by_direction.items()}
                    for name, by_direction in beam_valid.items()}
    for name, chosen in beam_penalty.items():
        log.info("evaluate: %s blank penalty %s (validation BLEU %s; greedy's %s)", name, chosen,
                 {d: round(beam_valid[name][d][p], 2) for d, p in chosen.items()}, dict(model.blank_penalty))
    decoders = decoders_for(model, evaluation, teachers, cmlms, beam_penalty)
    inputs_cut: dict[str, int] = {}
    scores: dict[str, Any] = {}
    signatures: dict[str, str] = {}
    roundtrip: dict[str, Any] = {}
    roundtrip_cut: dict[str, int] = {}  # split.side → outputs cut to the model's input limit for the round trip
    digests: dict[str, str] = {}
    progress = Progress("evaluate", len(evaluation.splits) * len(DIRECTIONS) * len(decoders), "decode")
    for split in evaluation.splits:
        src_text, tgt_text = read_split(corpus, split, cfg)
        sides = {"src2tgt": (src_text, tgt_text), "tgt2src": (tgt_text, src_text)}
        digests[split] = references_digest(src_text, tgt_text)
        greedy_ids = {}
        table: dict[str, list] = {"source": src_text, "reference": tgt_text}  # one row a sentence pair, greedy both ways
        for direction, (inputs, references) in sides.items():
            encoded, inputs_cut[f"{split}.{direction}"] = cut_to([e[:-1] for e in encode_lines(sp, inputs)], limit)
            if inputs_cut[f"{split}.{direction}"]:
                log.warning("evaluate: %d %s %s inputs longer than the decoders read (%d pieces with EOS), cut to it "
                            "(results.json: inputs_cut)", inputs_cut[f"{split}.{direction}"], split, direction, limit)
            line = []
            for decoder, translate in decoders.items():
                progress.doing(f"{split} {direction} {decoder}")
                started = clock()
                ids = translate(encoded, direction, evaluation.batch_size)
                seconds = clock() - started
                hypotheses = [sp.decode(h) for h in ids]
                write_text(out / f"{split}.{direction}.{decoder}.txt", "".join(h + "\n" for h in hypotheses))
                result = corpus_scores(hypotheses, references)
                signatures.update(bleu=result.pop("bleu_signature"), chrf=result.pop("chrf_signature"))
                scores[f"{split}.{direction}.{decoder}"] = {**result, "sentences": len(ids), "seconds": round(seconds, 3)}
                line.append(f"{decoder} {result['bleu']:.2f}/{result['chrf']:.1f} ({seconds:.1f} s)")
                progress.update(progress.done + 1, f"last {split} {direction} {decoder}: BLEU {result['bleu']:.2f}")
                if decoder == "greedy":
                    greedy_ids[direction] = ids
                    table[f"hypothesis_{direction}"] = hypotheses
                    bleu, chrf = sentence_scores(hypotheses, references)
                    table[f"bleu_{direction}"] = [round(value, SHOWN_DECIMALS) for value in bleu]
                    table[f"chrf_{direction}"] = [round(value, SHOWN_DECIMALS) for value in chrf]
                    judged = confidences(model, encoded, ids, direction, evaluation.batch_size)
                    table[f"confidence_{direction}"] = [None if c.score is None else round(c.score, 4) for c in judged]
                    rho = spearman(np.array([-np.inf if c.score is None else c.score for c in judged]), np.array(chrf))
                    scores[f"{split}.{direction}.greedy"]["confidence_spearman"] = \
                        round(rho, 4) if np.isfinite(rho) else None  # None: every chrF (or score) equal
            log.info("evaluate %s %s (%d sentences), BLEU/chrF: %s", split, direction, len(inputs), ", ".join(line))
        for direction, (inputs, _) in sides.items():  # x -> ŷ -> x̂, scored against x
            back = "tgt2src" if direction == "src2tgt" else "src2tgt"
            side = "src" if direction == "src2tgt" else "tgt"
            fed, roundtrip_cut[f"{split}.{side}"] = cut_to(greedy_ids[direction], model.max_input_length())
            if roundtrip_cut[f"{split}.{side}"]:
                log.warning("evaluate: %d of %d %s %s greedy outputs are longer than the model reads back (%d pieces "
                            "with EOS): cut to it for the round trip (results.json: roundtrip_cut)",
                            roundtrip_cut[f"{split}.{side}"], len(fed), split, direction, model.max_input_length())
            restored = translate_ids(model, fed, back, batch_size=evaluation.batch_size)
            text = [sp.decode(h) for h in restored]
            write_text(out / f"{split}.roundtrip_{side}.greedy.txt", "".join(h + "\n" for h in text))
            roundtrip[f"{split}.{side}"] = corpus_bleu(text, inputs)[0]
        (out / TRANSLATIONS_DIR).mkdir(exist_ok=True)
        write_text(out / TRANSLATIONS_DIR / f"{split}.json", json.dumps(table, ensure_ascii=False))  # columns in order
    progress.close()
    headline_split = "test" if "test" in evaluation.splits else evaluation.splits[0]
    results: dict[str, Any] = {"split": headline_split, "decoder": "greedy",
                               "device": device_name(next(model.parameters()).device)}
    sets = {split: {**headline(scores, roundtrip, split), "references_sha256": digests[split]}
            for split in evaluation.splits}
    results.update(sets[headline_split])
    results.update(bleu_signature=signatures["bleu"], chrf_signature=signatures["chrf"], mlflow_run_id=mlflow_run_id,
                   model_dir=str(model_dir), src_lang=meta["src_lang"], tgt_lang=meta["tgt_lang"],
                   blank_penalty=dict(model.blank_penalty), beam_blank_penalty=beam_penalty,
                   beam_blank_penalty_valid={name: {d: {f"{p:g}": round(b, 2) for p, b in bleu.items()}
                                                    for d, bleu in by_direction.items()}
                                             for name, by_direction in beam_valid.items()},
                   scores=scores,
                   roundtrip=roundtrip, roundtrip_cut=roundtrip_cut, inputs_cut=inputs_cut, sets=sets)
    if evaluation.measure_speed:
        src_text, _ = read_split(corpus, headline_split, cfg)
        log.info("evaluate: timing %d decoders (evaluate.measure_speed)", len(decoders))
        results["speed"] = measure_speed(model, cut_to([e[:-1] for e in encode_lines(sp, src_text)], limit)[0], decoders,
                                         evaluation)
    write_json(out / RESULTS_FILE, results)
    return {f"{split}_{key}": value for split in test_splits(results) for key, value in sets[split].items()
            if key in HEADLINE and value is not None}


def headline(scores: dict[str, Any], roundtrip: dict[str, float], split: str) -> dict[str, Any]:
    """The headline numbers of one scored split or test set (greedy): BLEU and chrF both ways, both round trips,
    and its sentences."""
    row: dict[str, Any] = {}
    for direction in DIRECTIONS:
        entry = scores[f"{split}.{direction}.greedy"]
        row[f"bleu_{direction}"], row[f"chrf_{direction}"] = entry["bleu"], entry["chrf"]
        row[f"confidence_spearman_{direction}"] = entry["confidence_spearman"]
    return {**row, "roundtrip_bleu_src": roundtrip[f"{split}.src"], "roundtrip_bleu_tgt": roundtrip[f"{split}.tgt"],
            "sentences": scores[f"{split}.src2tgt.greedy"]["sentences"]}


def references_digest(src_text: list[str], tgt_text: list[str]) -> str:
    """SHA-256 of a scored set's two sides: which scores may be compared (the registry alias, tracking.alias)."""
    return hashlib.sha256(json.dumps([src_text, tgt_text], ensure_ascii=False).encode("utf-8")).hexdigest()



def device_name(device: torch.device) -> str:
    """What decoded: the GPU's name on CUDA ("NVIDIA H100 80GB HBM3"), else the device type and the threads."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads)"


def measure_speed(model: Any, encoded: list[list[int]], decoders: dict[str, Decoder], evaluation: Any) -> dict[str, Any]:
    """Latency (ms per sentence, batch 1, mean and p90) and throughput (sentences/s at a large batch) of every
    decoder, src2tgt; with teacher decoders, REDER's speed-up over each of them."""
    import torch

    speed: dict[str, Any] = {"device": str(next(model.parameters()).device), "threads": torch.get_num_threads(),
                             "direction": "src2tgt"}
    single = encoded[: evaluation.latency_sentences]
    for decoder, translate in decoders.items():
        if single:
            translate(single[:2], "src2tgt", 1)  # warm-up
            times = []
            for sequence in single:
                started = clock()
                translate([sequence], "src2tgt", 1)
                times.append(clock() - started)
            times.sort()
            speed[f"{decoder}_latency_ms"] = round(1000 * sum(times) / len(times), 3)
            speed[f"{decoder}_latency_p90_ms"] = round(1000 * times[int(0.9 * (len(times) - 1))], 3)
        started = clock()
        translate(encoded, "src2tgt", evaluation.throughput_batch)
        speed[f"{decoder}_sentences_per_s"] = round(len(encoded) / (clock() - started), 2)
    for ours in [d for d in decoders if not d.startswith("teacher_")]:
        for baseline in [d for d in decoders if d.startswith("teacher_")]:
            if single:
                speed[f"speedup_{ours}_vs_{baseline}_batch1"] = round(
                    speed[f"{baseline}_latency_ms"] / speed[f"{ours}_latency_ms"], 2)
            speed[f"speedup_{ours}_vs_{baseline}_batch{evaluation.throughput_batch}"] = round(
                speed[f"{ours}_sentences_per_s"] / speed[f"{baseline}_sentences_per_s"], 2)
    return speed
