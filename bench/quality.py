"""Quality on Multi30k En↔De, both directions: AR teachers vs REDER with and without KD and without the
auxiliary losses, the same number of updates each, on one GPU (or CPU, slowly), without Ray.

    python -m bench.quality teachers --data-dir ../shared/data/multi30k --out OUT [--steps 3000]
    python -m bench.quality reder --data-dir ../shared/data/multi30k --from OUT --out OUT2 [--steps 3000]
    python -m bench.quality aux --data-dir ../shared/data/multi30k --from OUT --out OUT3 [--steps 3000] [--aux-from 0.75]
    python -m bench.quality speed --data-dir ../shared/data/multi30k --from OUT --out OUT2

Two phases, so that each fits one 10-minute GPU call (the device machines have no Ray: the models train in
this process through the pipeline's training core, pipeline/training/harness.py, with the `train` / `teacher.train`
section of the config and the budget of the command line; `configs/multi30k.yaml` is the same recipe through Ray):
- `teachers`: a joint SentencePiece model (the pipeline's spm stage code), one AR Transformer per direction
  (`teacher` section of configs/multi30k.yaml) trained `--steps` updates, scored on test_2016_flickr and
  test_2017_flickr (sacreBLEU/chrF, greedy and beam 4) and timed (latency at batch 1 over
  `evaluate.latency_sentences`, sentences/s at `evaluate.throughput_batch`, pipeline.stages.evaluate.measure_speed); then the whole training split distilled both ways (beam 4,
  pipeline.stages.distill.decode and apply_fallbacks; not with `--no-distill`, for a baseline, or to give the reder
  phase's variants without KD their SentencePiece model and references only). Writes spm.model,
  kd.parquet, teacher-<direction>/ (model directories) and teachers.json into OUT.
- `reder`: REDER (`model` section of configs/multi30k.yaml) trained `--steps` updates per variant and seed —
  `kd` (KD pairs, FBA + CC from `--aux-from`), `raw` (the references, same), `kd_noaux` (KD pairs, no
  auxiliary losses), `dag_kd` / `dag_kd_noaux` (the DAG head instead of CTC), `raw_noaux` (the references, no
  auxiliary losses), and the simplex baselines `simplex` (KD pairs) / `simplex_raw` (the references): one model per
  direction (`loss.directions`), each `--steps` updates in its own direction, no FBA/CC — each scored with the
  evaluate stage's decoders (`decoders_for`: CTC greedy, `--beam` and teacher reranking when the teachers
  were saved; DAG greedy, lookahead, Viterbi) on both test sets, both directions, round trip (greedy),
  and timed the same way (with the teachers' greedy and beam 4 alongside when they were saved).
- `aux`: the auxiliary losses' paired ablation, the paper's two-stage recipe: one REDER on the KD pairs without
  FBA/CC to update `--aux-from` × `--steps`, then continued to `--steps` twice from the same weights, optimizer
  state and batches, with FBA + CC and without; the first stage and both continuations scored as in `reder`,
  and the continuations compared with sacreBLEU's paired bootstrap on every test set and direction.
- `speed`: REDERs that were trained side by side on one device (`reder --save-models --no-speed`, one process
  each, as the H100's five systems were) timed afterwards, alone, beside the teachers, into OUT2's reder.json.
Each model is its last update, or, with `--validate-every N`, what the pipeline's train stage publishes: the
average of the best `--average-best` checkpoints by greedy BLEU on the validation split, scored every N updates
(the last update's greedy scores are reported beside it). Prints and writes JSON (`teachers.json` /
`reder.json` / `aux.json`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from bench import MULTI30K, REPO_ROOT

TESTS = ("test_2016_flickr", "test_2017_flickr")
VALID = "val"
LAST_UPDATE = "last_update_greedy"  # an averaged model's last update, scored greedily before averaging
MODEL_DIR = "model-"  # + a reder phase's key: the model directories of --save-models
# aux: the continuations with auxiliary terms by --aux-terms, each named "kd" + its suffix (compared with kd_noaux)
AUX_TERMS = {"both": "", "fba": "_fba", "cc": "_cc"}


def _speed(cfg) -> SimpleNamespace:
    """What measure_speed times: the config's `evaluate.latency_sentences` at batch 1, sentences/s at
    `evaluate.throughput_batch` (100 and 64 by default; key=value overrides change them)."""
    return SimpleNamespace(latency_sentences=cfg.evaluate.latency_sentences, throughput_batch=cfg.evaluate.throughput_batch)


def _lines(data: Path, split: str) -> tuple[list[str], list[str]]:
    return ((data / f"{split}.en").read_text(encoding="utf-8").splitlines(),
            (data / f"{split}.de").read_text(encoding="utf-8").splitlines())


def _scores(translate, sp, data: Path, directions=("src2tgt", "tgt2src"),
            kept: dict | None = None, splits: tuple[str, ...] = TESTS) -> dict[str, dict[str, float]]:
    """sacreBLEU BLEU/chrF of `translate(encoded, direction)` on `splits` (both test sets; the detokenized
    outputs go into `kept` when given, by split and direction)."""
    from pipeline.metrics import corpus_scores
    from reder.decoding.run import encode_lines

    scores = {}
    for split in splits:
        english, german = _lines(data, split)
        for direction in directions:
            inputs, references = (english, german) if direction == "src2tgt" else (german, english)
            hypotheses = [sp.decode(h) for h in translate(encode_lines(sp, inputs), direction)]
            result = corpus_scores(hypotheses, references)
            if kept is not None:
                kept[f"{split}.{direction}"] = hypotheses
            scores[f"{split}.{direction}"] = {"bleu": round(result["bleu"], 2), "chrf": round(result["chrf"], 2)}
    return scores


def _roundtrip(translate, sp, data: Path) -> dict[str, float]:
    """Round-trip BLEU on test_2016_flickr: x → ŷ → x̂ scored against x, for each side (`translate` as in _scores)."""
    from pipeline.metrics import corpus_scores
    from reder import EOS_ID
    from reder.decoding.run import encode_lines

    english, german = _lines(data, TESTS[0])
    result = {}
    for side, (lines, direction, back) in {"src": (english, "src2tgt", "tgt2src"),
                                           "tgt": (german, "tgt2src", "src2tgt")}.items():
        forward = translate(encode_lines(sp, lines), direction)
        restored = translate([h + [EOS_ID] for h in forward], back)
        result[f"roundtrip_bleu_{side}"] = round(corpus_scores([sp.decode(h) for h in restored], lines)["bleu"], 2)
    return result


def _greedy(model):
    """translate(encoded, direction) with `model`'s greedy decoder (a teacher's beam 1)."""
    from reder.decoding.run import translate_ids

    return lambda encoded, direction: translate_ids(model, encoded, direction)


def _train_config(args: argparse.Namespace, section):
    """The config's `train` (REDER) or `teacher.train` section with the benchmark's budget: --steps, --lr,
    --warmup, --max-tokens, and with --validate-every its --average-best."""
    average = args.average_best if args.validate_every else 1
    return replace(section, max_steps=args.steps, lr=args.lr, warmup_steps=args.warmup, max_tokens=args.max_tokens,
                   validate_every=args.validate_every or args.steps, average_best=average,
                   keep_checkpoints=max(section.keep_checkpoints, average))


def _harness(args: argparse.Namespace, model, objective, train, device: str, sp=None, data: Path | None = None,
             directions=("src2tgt", "tgt2src")):
    """The pipeline's training core for `model`; with --validate-every it scores greedy BLEU on the validation
    split in `directions` (their mean, as the pipeline's valid_bleu) and keeps the best --average-best."""
    from pipeline.training.harness import Harness

    def validate(scored) -> dict[str, float]:
        scores = _scores(_greedy(scored), sp, data, directions, splits=(VALID,))
        return {"valid_bleu": sum(score["bleu"] for score in scores.values()) / len(scores)}
    return Harness(model, objective, train, device, validate=validate if args.validate_every else None,
                   keep_best=bool(args.validate_every))


def _average(model, harness, sp, data: Path, directions=("src2tgt", "tgt2src")) -> dict:
    """Score the last update's `model` greedily on the test sets, then load the average of the best
    checkpoints into it (what the rest of the report scores): the pipeline's published model."""
    last = _scores(_greedy(model), sp, data, directions)
    averaged = [{"step": kept["step"], "valid_bleu": round(kept["valid_bleu"], 2)} for kept in harness.average()]
    return {LAST_UPDATE: last, "averaged": averaged, "validation_seconds": round(harness.validation_seconds, 3)}


def _header(args: argparse.Namespace, device: str) -> dict:
    """What every report starts with: the machine, the date and the training budget."""
    return {"benchmark": "quality", "phase": args.phase, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.platform(), "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "steps": args.steps, "time_cap_s": args.time_cap_s if args.time_cap_s != float("inf") else None,
            "max_tokens": args.max_tokens, "lr": args.lr, "warmup": args.warmup,
            "validate_every": args.validate_every, "average_best": args.average_best if args.validate_every else 1,
            "overrides": args.overrides}


def teachers_phase(args: argparse.Namespace, cfg, device: str) -> dict:
    import sentencepiece

    from pipeline.stages import distill, spm
    from pipeline.stages.evaluate import measure_speed
    from reder.objectives.directional import TeacherObjective
    from reder import TransformerConfig
    from reder.autoregressive import Transformer
    from reder.checkpoint import save_model_dir
    from reder.decoding.run import encode_lines, translate_ids

    data, out = Path(args.data_dir), Path(args.out)
    english, german = _lines(data, "train")
    english, german = english[: args.train_limit or None], german[: args.train_limit or None]
    started = time.perf_counter()
    proto = spm.train(english + german, cfg.model.vocab_size, num_threads=os.cpu_count() or 1)
    (out / "spm.model").write_bytes(proto)
    sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
    src, tgt = sp.encode(english), sp.encode(german)
    report = {**_header(args, device), "spm_seconds": round(time.perf_counter() - started, 1), "train_pairs": len(src)}
    teachers, train = {}, _train_config(args, cfg.teacher.train)
    for direction in ("src2tgt", "tgt2src"):
        torch.manual_seed(1)
        model = Transformer(TransformerConfig.from_dict(cfg.teacher.model.to_dict())).to(device)
        harness = _harness(args, model, TeacherObjective(model, direction), train, device, sp, data, (direction,))
        report[f"train_{direction}"] = harness.fit_examples(list(zip(src, tgt)), time_cap_s=args.time_cap_s)
        if args.validate_every:
            report[f"train_{direction}"].update(_average(model, harness, sp, data, (direction,)))
        teachers[direction] = model
        save_model_dir(out / f"teacher-{direction}", model, out / "spm.model", "en", "de", extra={"direction": direction})
    for beam in (1, 4):
        translate = lambda encoded, d, beam=beam: translate_ids(teachers[d], encoded, d, "beam", 64,  # noqa: E731
                                                                beam_size=beam)
        report[f"teacher_{'greedy' if beam == 1 else f'beam{beam}'}"] = {**_scores(translate, sp, data),
                                                                       **_roundtrip(translate, sp, data)}
    test = encode_lines(sp, _lines(data, TESTS[0])[0])
    report["speed"] = measure_speed(teachers["src2tgt"], test, {
        "teacher_greedy": lambda enc, d, bs: translate_ids(teachers[d], enc, d, "greedy", bs),
        "teacher_beam4": lambda enc, d, bs: translate_ids(teachers[d], enc, d, "beam", bs, beam_size=4)}, _speed(cfg))
    if args.no_distill:  # a baseline only (e.g. the teachers at REDER's training cost), no KD corpus
        return report
    started = time.perf_counter()
    kd_tgt = distill.decode(teachers["src2tgt"], src, "src2tgt", 4, 1.0, 1.2, 10, batch_size=512)
    kd_src = distill.decode(teachers["tgt2src"], tgt, "tgt2src", 4, 1.0, 1.2, 10, batch_size=512)
    ids = pa.list_(pa.int32())
    table = pa.table({"id": pa.array(range(len(src)), pa.int64()), "src_ids": pa.array(src, ids),
                      "kd_tgt_ids": pa.array(kd_tgt, ids), "tgt_ids": pa.array(tgt, ids), "kd_src_ids": pa.array(kd_src, ids)})
    report["distill_seconds"] = round(time.perf_counter() - started, 1)
    report["distill"] = distill.statistics(table, out / "spm.model")
    table, report["distill_fallbacks"] = distill.apply_fallbacks(table, cfg)
    pq.write_table(table, out / "kd.parquet")
    return report


# name: (trained on the KD pairs, FBA + CC switched on at --aux-from, model overrides, simplex). A simplex
# variant is one model per direction (loss.directions), each trained --steps updates in its direction only, without
# FBA/CC (they need the other direction); its row's scores are each direction's own model's.
VARIANTS = {
    "kd": (True, True, {}, False),
    "raw": (False, True, {}, False),
    "kd_noaux": (True, False, {}, False),
    "dag_kd": (True, True, {"head": "dag"}, False),
    "dag_kd_noaux": (True, False, {"head": "dag"}, False),
    "raw_noaux": (False, False, {}, False),
    "simplex": (True, False, {}, True),
    "simplex_raw": (False, False, {}, True),
}
DIRECTIONS = ("src2tgt", "tgt2src")


def _load_teachers(source: Path, vocab_size: int, device: str) -> dict:
    """The teachers phase's models when it saved them (older outputs have none): baseline speed and reranking."""
    from reder.checkpoint import load_teacher_dir

    dirs = {d: source / f"teacher-{d}" for d in ("src2tgt", "tgt2src")}
    return {d: load_teacher_dir(p, d, vocab_size, device) for d, p in dirs.items()} if all(p.is_dir() for p in dirs.values()) else {}


def _reder_inputs(args: argparse.Namespace, cfg, device: str) -> SimpleNamespace:
    """What the reder and aux phases read from the teachers phase's output: the SentencePiece model, the
    token ids of the references and of the KD outputs, the teachers (when saved) and the evaluation settings."""
    import sentencepiece

    from reder.decoding.run import encode_lines

    data, source = Path(args.data_dir), Path(args.source)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(source / "spm.model"))
    teachers = _load_teachers(source, cfg.model.vocab_size, device)
    evaluation = SimpleNamespace(**{**asdict(cfg.evaluate), **vars(_speed(cfg)), "teacher_baseline": bool(teachers),
                                    "teacher_beam_size": 4, "beam_size": args.beam,
                                    "rerank": "teacher" if teachers and args.beam > 1 else "none"})
    if (source / "kd.parquet").is_file():
        kd = pq.read_table(source / "kd.parquet")
        ids = {name: kd.column(name).to_pylist() for name in ("src_ids", "tgt_ids", "kd_tgt_ids", "kd_src_ids")}
    else:  # teachers --no-distill: the references only (--train-limit as there), for the variants without KD
        english, german = (lines[: args.train_limit or None] for lines in _lines(data, "train"))
        ids = {"src_ids": sp.encode(english), "tgt_ids": sp.encode(german), "kd_tgt_ids": None, "kd_src_ids": None}
    return SimpleNamespace(data=data, sp=sp, teachers=teachers, evaluation=evaluation,
                           test=encode_lines(sp, _lines(data, TESTS[0])[0]), **ids)


def _kd_examples(inputs: SimpleNamespace) -> list[tuple[list[int], ...]]:
    """The KD training examples as the distill stage's rows are read by the pipeline: (x, y, teacher(x),
    teacher(y)); src2tgt trains on (x, teacher(x)), tgt2src on (teacher(y), y)."""
    if inputs.kd_tgt_ids is None:
        raise FileNotFoundError("the teachers phase's output has no kd.parquet (it ran with --no-distill): "
                                "only the variants without KD can train on it")
    return list(zip(inputs.src_ids, inputs.tgt_ids, inputs.kd_tgt_ids, inputs.kd_src_ids))


def _systems(models: dict, evaluation, teachers: dict) -> dict:
    """decoders_for a duplex model ({direction: the same model}), or for a simplex pair ({direction: its own
    model}): each decoder translates a direction with that direction's model."""
    from pipeline.stages.evaluate import decoders_for

    if models["src2tgt"] is models["tgt2src"]:
        return decoders_for(models["src2tgt"], evaluation, teachers)
    own = {d: decoders_for(models[d], evaluation, teachers) for d in DIRECTIONS}
    return {name: (lambda enc, d, bs, name=name: own[d][name](enc, d, bs)) for name in own["src2tgt"]}


def _evaluate(model, inputs: SimpleNamespace, hypotheses: dict | None = None, speed: bool = True) -> dict:
    """A trained REDER (or a simplex pair, {direction: model}) scored with every decoder of the evaluate stage
    on both test sets both ways, its greedy round trip, and (unless `speed` is false) its speed, with the
    teachers' alongside when they were saved."""
    from pipeline.stages.evaluate import measure_speed

    entry = {}
    models = model if isinstance(model, dict) else {d: model for d in DIRECTIONS}
    model = models["src2tgt"]  # what measure_speed times (src2tgt)
    systems = _systems(models, inputs.evaluation, inputs.teachers)
    for decoder, translate in systems.items():
        if not decoder.startswith("teacher_"):  # the teachers are scored by their own phase
            kept = {} if hypotheses is not None else None
            entry[decoder] = _scores(lambda encoded, d, t=translate: t(encoded, d, 64), inputs.sp, inputs.data, kept=kept)
            if kept is not None:
                hypotheses[decoder] = kept
    greedy = next(iter(systems))  # greedy (CTC and DAG)
    entry.update(_roundtrip(lambda encoded, d: systems[greedy](encoded, d, 64), inputs.sp, inputs.data))
    if speed:
        entry["speed"] = measure_speed(model, inputs.test, systems, inputs.evaluation)
    return entry


def reder_phase(args: argparse.Namespace, cfg, device: str) -> dict:
    from reder import feasibility
    from reder import DuplexLoss, LossConfig, REDER
    from reder.checkpoint import save_model_dir

    inputs = _reder_inputs(args, cfg, device)
    src, tgt = inputs.src_ids, inputs.tgt_ids
    aux_from = int(args.aux_from * args.steps)
    report = {**_header(args, device), "train_pairs": len(src), "aux_from_update": aux_from, "seeds": args.seeds,
              "teachers_loaded": bool(inputs.teachers), "beam": args.beam}
    train = _train_config(args, cfg.train)
    for name in args.variants:
        use_kd, aux, overrides, simplex = VARIANTS[name]
        model_cfg = replace(cfg.model, memory_efficient=False, **overrides)
        loss_config = replace(cfg.loss, aux_start_step=aux_from) if aux else LossConfig(0.0, 0.0, 0)
        if use_kd:
            examples = _kd_examples(inputs)
        else:  # the references, filtered as the tokenize stage would for this head
            rule = feasibility.config_rule(model_cfg)
            feasible = [i for i in range(len(src)) if rule(len(src[i]), tgt[i]) and rule(len(tgt[i]), src[i])]
            report[f"{name}_feasible_reference_pairs"] = len(feasible)
            examples = [(src[i], tgt[i]) for i in feasible]
        for seed in args.seeds:
            key = name if len(args.seeds) == 1 else f"{name}_seed{seed}"
            models, entry = {}, {"head": model_cfg.head, "seed": seed, "simplex": simplex}
            for directions in [(d,) for d in DIRECTIONS] if simplex else [DIRECTIONS]:
                torch.manual_seed(seed)
                model = REDER(model_cfg).to(device)
                objective = DuplexLoss(model, replace(loss_config, directions=directions))
                harness = _harness(args, model, objective, train, device, inputs.sp, inputs.data, directions)
                fitted = {"train": harness.fit_examples(examples, time_cap_s=args.time_cap_s)}
                if args.validate_every:
                    fitted.update(_average(model, harness, inputs.sp, inputs.data, directions))
                for direction in directions:
                    models[direction] = model
                if simplex:
                    entry[f"train_{directions[0]}"] = fitted
                else:
                    entry.update(fitted)
                if args.save_models:
                    suffix = f"-{directions[0]}" if simplex else ""
                    save_model_dir(Path(args.out) / f"{MODEL_DIR}{key}{suffix}", model, Path(args.source) / "spm.model",
                                   "en", "de")
            if simplex:  # the row's budget: one model's updates (each direction's model has as many), both models' time
                parts = [entry[f"train_{d}"]["train"] for d in DIRECTIONS]
                entry["train"] = {"steps": parts[0]["steps"], "seconds": round(sum(p["seconds"] for p in parts), 1),
                                  "last_loss": None}
                if args.validate_every:
                    entry[LAST_UPDATE] = {cell: score for d in DIRECTIONS
                                          for cell, score in entry[f"train_{d}"][LAST_UPDATE].items()}
            entry.update(_evaluate(models, inputs, speed=not args.no_speed))
            report[key] = entry
            print(json.dumps({key: entry}), flush=True)
    return report


def speed_phase(args: argparse.Namespace, cfg, device: str) -> dict:
    """Time, alone on the device, the models a reder phase saved (`--save-models`, usually run with
    `--no-speed` because several trainings shared the device): every decoder of its report (its `--beam`)
    and the teachers' greedy and beam 4 in the same process, written into --out's reder.json as each entry's
    `speed` (atomically; the report's `speed_measured` says when and where). Returns {key: speed}."""
    from pipeline.stages.evaluate import measure_speed
    from pipeline.stage import write_text
    from reder.checkpoint import load_model_dir

    path = Path(args.out) / "reder.json"
    if not path.is_file():
        raise FileNotFoundError(f"speed: {path} does not exist (run the reder phase with --out {args.out} first)")
    report = json.loads(path.read_text(encoding="utf-8"))
    keys = [key for key, entry in report.items() if isinstance(entry, dict) and "train" in entry]
    missing = [key for key in keys if not all((Path(args.out) / f"{MODEL_DIR}{key}{suffix}").is_dir() for suffix in
                                              ([f"-{d}" for d in DIRECTIONS] if report[key].get("simplex") else [""]))]
    if not keys or missing:
        raise FileNotFoundError(f"speed: {path}: no saved model for {missing or 'any system'} "
                                f"(run the reder phase with --save-models)")
    inputs = _reder_inputs(args, cfg, device)
    inputs.evaluation.beam_size = report.get("beam", 1)
    inputs.evaluation.rerank = "teacher" if inputs.teachers and inputs.evaluation.beam_size > 1 else "none"
    result = {**_header(args, device), "teachers_loaded": bool(inputs.teachers)}
    for key in keys:
        suffix = {d: f"-{d}" if report[key].get("simplex") else "" for d in DIRECTIONS}
        models = {d: load_model_dir(Path(args.out) / f"{MODEL_DIR}{key}{suffix[d]}", device)[0] for d in DIRECTIONS}
        report[key]["speed"] = result[key] = measure_speed(models["src2tgt"], inputs.test,
                                                           _systems(models, inputs.evaluation, inputs.teachers),
                                                           inputs.evaluation)
        print(json.dumps({key: result[key]}), flush=True)
    report["speed_measured"] = {"date": result["date"], "device": result["device"], "by": "bench.quality speed"}
    write_text(path, json.dumps(report, indent=2))  # in the reder phase's order: the table lists rows by it
    return result


def _paired_bootstrap(baseline: dict, system: dict, data: Path, samples: int = 1000) -> dict:
    """sacreBLEU's paired bootstrap resampling (as `sacrebleu --paired-bs`) of `system` against `baseline`
    on every test set and direction: {cell: {baseline, system, delta, p_value, ci95 of system}}."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    result = {}
    for split in TESTS:
        english, german = _lines(data, split)
        for direction, references in (("src2tgt", german), ("tgt2src", english)):
            cell = f"{split}.{direction}"
            _, scores = PairedTest([("baseline", baseline[cell]), ("system", system[cell])], {"BLEU": BLEU()},
                                   [references], test_type="bs", n_samples=samples)()
            base, other = scores["BLEU"]
            result[cell] = {"baseline": round(base.score, 2), "system": round(other.score, 2),
                            "delta": round(other.score - base.score, 2), "p_value": round(other.p_value, 4),
                            "system_ci95": round(other.ci, 2), "samples": samples}
    return result


def aux_phase(args: argparse.Namespace, cfg, device: str) -> dict:
    """The auxiliary losses' gain as the paper measures it: one REDER trained on the KD pairs without them to
    update --aux-from × --steps (the first stage), then continued to --steps per seed from the same weights
    and optimizer state: without them (`kd_noaux`) and with each of --aux-terms — FBA + CC (`kd`), FBA alone
    (`kd_fba`), CC alone (`kd_cc`), each term at the config's weight. A seed fixes the continuations' dropout
    and the order of their batches (`train.seed`), the same for all of a seed; seed 1 is the first stage's own.
    All are scored; each continuation with terms is compared with `kd_noaux` by sacreBLEU's paired bootstrap on
    every test set and direction (`paired_bootstrap_greedy[_fba|_cc][_seedN]`), and over the seeds the mean
    difference with its smallest and largest (`over_seeds_greedy[_fba|_cc]`)."""
    import copy

    from reder import DuplexLoss, LossConfig, REDER

    if args.validate_every:
        raise ValueError("aux: --validate-every is not supported: the continuations fork the last update's state")
    fork = int(args.aux_from * args.steps)
    if not 0 < fork < args.steps:
        raise ValueError(f"aux: --aux-from {args.aux_from} must put the fork strictly inside the {args.steps} updates")
    weights = {"both": (cfg.loss.lambda_fba, cfg.loss.lambda_cc), "fba": (cfg.loss.lambda_fba, 0.0),
               "cc": (0.0, cfg.loss.lambda_cc)}
    if any(weights[term] == (0.0, 0.0) for term in args.aux_terms):
        raise ValueError(f"aux: --aux-terms {' '.join(args.aux_terms)} with loss.lambda_fba {cfg.loss.lambda_fba} and "
                         f"loss.lambda_cc {cfg.loss.lambda_cc}: a continuation would have no auxiliary term")
    runs = {AUX_TERMS[term]: LossConfig(*weights[term], aux_start_step=fork) for term in args.aux_terms}
    inputs = _reder_inputs(args, cfg, device)
    model_cfg, train = replace(cfg.model, memory_efficient=False), _train_config(args, cfg.train)
    examples = _kd_examples(inputs)
    report = {**_header(args, device), "train_pairs": len(inputs.src_ids), "fork_update": fork, "seeds": args.seeds,
              "teachers_loaded": bool(inputs.teachers), "head": model_cfg.head,
              "lambda_fba": cfg.loss.lambda_fba, "lambda_cc": cfg.loss.lambda_cc, "aux_terms": args.aux_terms}
    torch.manual_seed(1)
    model = REDER(model_cfg).to(device)
    harness = _harness(args, model, DuplexLoss(model, LossConfig(0.0, 0.0, 0)), train, device)
    stage1 = harness.fit_examples(examples, until=fork)
    state = copy.deepcopy(harness.state_dict())  # weights, optimizer, schedule, position in the data
    report["stage1"] = {"train": stage1, **_evaluate(model, inputs, speed=not args.no_speed)}
    print(json.dumps({"stage1": report["stage1"]}), flush=True)
    for seed in args.seeds:
        hypotheses, suffix = {}, "" if args.seeds == [1] else f"_seed{seed}"
        for name, loss_config in (*((f"kd{term}", config) for term, config in runs.items()),
                                  ("kd_noaux", LossConfig(0.0, 0.0, 0))):
            torch.manual_seed(seed + 1)
            model = REDER(model_cfg).to(device)
            harness = _harness(args, model, DuplexLoss(model, loss_config), replace(train, seed=seed), device)
            harness.load_state_dict(copy.deepcopy(state))
            entry = {"seed": seed, "train": harness.fit_examples(examples)}
            entry.update(_evaluate(model, inputs, hypotheses.setdefault(name, {}), speed=not args.no_speed))
            report[name + suffix] = entry
            print(json.dumps({name + suffix: entry}), flush=True)
        for term in runs:
            report[f"paired_bootstrap_greedy{term}{suffix}"] = _paired_bootstrap(
                hypotheses["kd_noaux"]["greedy"], hypotheses[f"kd{term}"]["greedy"], inputs.data)
    for term in runs if len(args.seeds) > 1 else ():
        pairs = [report[f"paired_bootstrap_greedy{term}_seed{seed}"] for seed in args.seeds]
        report[f"over_seeds_greedy{term}"] = {
            cell: {"mean_delta": round(sum(p[cell]["delta"] for p in pairs) / len(pairs), 2),
                   "min_delta": min(p[cell]["delta"] for p in pairs),
                   "max_delta": max(p[cell]["delta"] for p in pairs),
                   "significant_worse": sum(p[cell]["delta"] < 0 and p[cell]["p_value"] < 0.05 for p in pairs),
                   "significant_better": sum(p[cell]["delta"] > 0 and p[cell]["p_value"] < 0.05 for p in pairs)}
            for cell in pairs[0]}
    return report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=("teachers", "reder", "aux", "speed"))
    parser.add_argument("--data-dir", default=str(MULTI30K))
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--from", dest="source", default="", help="reder, aux, speed: the teachers phase's output directory")
    parser.add_argument("--config", default=str(REPO_ROOT / "configs" / "multi30k.yaml"))
    parser.add_argument("--steps", type=int, default=3000, help="updates per model")
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--lr", type=float, default=7e-4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--validate-every", type=int, default=0,
                        help="teachers, reder: score greedy BLEU on the validation split every N updates and publish "
                             "the average of the best --average-best checkpoints, as the pipeline's train stage does "
                             "(its last update is scored too, as last_update_greedy); 0: the last update alone")
    parser.add_argument("--average-best", type=int, default=5, help="with --validate-every: checkpoints averaged")
    parser.add_argument("--time-cap-s", type=float, default=float("inf"), help="stop a model's training after this")
    parser.add_argument("--variants", nargs="+", default=["kd", "raw", "kd_noaux", "dag_kd"], choices=list(VARIANTS))
    parser.add_argument("--aux-from", type=float, default=0.5, help="reder: FBA + CC from this fraction of --steps; aux: where the first stage ends")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="reder: one model per variant and seed; aux: one set of continuations per seed")
    parser.add_argument("--aux-terms", nargs="+", default=["both"], choices=list(AUX_TERMS),
                        help="aux: the continuations compared with the one without auxiliary losses: FBA + CC (both), "
                             "FBA alone (fba), CC alone (cc), each at the config's weight")
    parser.add_argument("--beam", type=int, default=1,
                        help="reder: also score CTC beam search of this size (and teacher reranking when the teachers "
                             "phase saved its models); DAG models are scored with all their decoders")
    parser.add_argument("--no-distill", action="store_true",
                        help="teachers: train, score and time the teachers only (a baseline), without the KD corpus")
    parser.add_argument("--save-models", action="store_true",
                        help="reder: save each model as a model directory OUT/model-<variant> (for the speed phase)")
    parser.add_argument("--no-speed", action="store_true",
                        help="reder: do not time the models (several trainings share the device; time them "
                             "afterwards, alone, with the speed phase)")
    parser.add_argument("--train-limit", type=int, default=0, help="use the first N training pairs (0 = all)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. model.d_model=256")
    args = parser.parse_intermixed_args(argv)
    from pipeline.config import load_config

    cfg = load_config(args.config, args.overrides)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report = {"teachers": teachers_phase, "reder": reder_phase, "aux": aux_phase,
              "speed": speed_phase}[args.phase](args, cfg, device)
    (Path(args.out) / f"{args.phase}.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
