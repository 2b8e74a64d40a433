"""What each stage hashes into its directory name, in one place: one versioned stage-key scheme.

A stage's directory is `<workdir>/<name>-<digest>`, the digest over the stage's name, its key (below) and the
directory names of its hashed inputs (pipeline/graph.py, pipeline/stage.py). The rules:

- A key holds the values of the config sections the stage depends on, less what changes no output
  (`NOT_HASHED`, and per stage what its key function leaves out, e.g. distill's batching).
- A key added to a hashed section after outputs existed is hashed only away from the value it was added with
  (`ADDED_LATER`, key → that value): outputs made before it keep their directories, and a later change of its
  default re-keys the stages that hash it (and what follows them), nothing else (tests/pipeline/test_graph.py).
- `pipeline.stage.KEY_VERSION` is the scheme's version. Version 1 is the keys of every directory made so far;
  its digest holds no version field. A change to the keys themselves (not a key added later, not a changed
  default) raises it, and the digest then holds `"version"`: every stage gets a new directory, to be
  documented in docs/OPERATIONS.md.

`run_pipeline.py --dry-run` says, per stage, whether a run would reuse a directory, and which keys differ from
the nearest finished one when it would not.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.config import NO_BLANK_PENALTY, PipelineConfig, TrainConfig
from pipeline.stages import distill, evaluate, ingest, teacher
from reder import feasibility
from reder.feasibility import EMITS_BLANK

# Keys of a train section that change neither the data order nor the optimisation: not hashed. min_workers does
# only once a host is lost, and a run that stopped for a lost host must find its checkpoints with it set.
NOT_HASHED = ("log_every", "max_failures", "storage_path", "fail_at_step", "start_timeout_s", "valid_max_sentences",
              "min_workers")
# Keys added to a hashed section after outputs existed (evaluate options, the DAG dp, named test sets, the ingest's
# `bad_characters`, ...), with the value each was added with: hashed only away from it, the behaviour from before.
ADDED_LATER: dict[str, dict[str, Any]] = {
    "data": {"bad_characters": "error"},
    "model": {"dag_dp": "auto"},
    "loss": {"fba_start_step": None, "cc_start_step": None, "directions": ("src2tgt", "tgt2src"), "glance_start": 0.0,
             "glance_end": 0.0, "glance_steps": 0, "glance_blanks": False, "nmla_start_step": None, "nmla_ngram": 2,
             "nmla_ctc_weight": 0.0, "nmla_start_fraction": None},
    "train": {"batch_tokens": "sum", "max_time": 0.0, "patience": 0, "lr_scheduler": "inverse_sqrt",
              "warmup_fraction": 0.0, "compile": False, "min_workers": 0},  # compile: inductor's dropout draws other masks
    "evaluate": {"rerank_weight": 1.0, "cutoff_top_n": 40, "cutoff_prob": 1.0, "dag_max_transition": 0,
                 "dag_no_repeat_ngram": 0, "dag_length_penalty": 1.0, "cmlm_iterations": (), "cmlm_length_beam": 5,
                 "refine_steps": (), "test_sets": {}},
}
# Named in the teacher and cmlm stages' keys since both directions train in one Ray Train run (each
# update trains both models, which draws initialisation and dropout from one random stream): a new output, a new
# directory.
PAIR = {"training": "both directions in one run"}


def section_key(name: str, section: Any) -> dict[str, Any]:
    """`asdict(section)` less the ADDED_LATER keys of section `name` at the value they were added with."""
    added = ADDED_LATER.get(name, {})
    return {k: v for k, v in asdict(section).items() if k not in added or v != added[k]}


def train_key(section: TrainConfig) -> dict[str, Any]:
    """The hashed part of a train section (REDER's, the teachers' or the CMLMs')."""
    return {k: v for k, v in section_key("train", section).items() if k not in NOT_HASHED}


def ingest_key(cfg: PipelineConfig) -> dict[str, Any]:
    """The data section (less `download`, `cache_dir` and `max_input_mb`, which do not change the data) and
    `ingest.input_fingerprint`. Where files in `local_dir` fingerprint it, the directory's path stays out of the
    key: the same corpus gives the same stage directories wherever it lies (another checkout; the working
    directory `ray job submit` unpacks to a new path every session)."""
    data = cfg.data
    files = ingest.input_fingerprint(data)
    section = {k: v for k, v in section_key("data", data).items() if k not in ("download", "cache_dir", "max_input_mb")}
    if files and data.source != "sword":
        del section["local_dir"]
    return {"data": section, "files": files}


def spm_key(cfg: PipelineConfig) -> dict[str, Any]:
    """The spm section less its thread count, and the vocabulary size."""
    return {"spm": {k: v for k, v in asdict(cfg.spm).items() if k != "num_threads"}, "vocab_size": cfg.model.vocab_size}


def tokenize_key(cfg: PipelineConfig) -> dict[str, Any]:
    """What the feasibility filter depends on (reder.feasibility.key)."""
    return feasibility.key(cfg.model)


def teacher_key(cfg: PipelineConfig) -> dict[str, Any]:
    """The given checkpoints, or the teachers' model and train sections (and `PAIR`)."""
    given = teacher.given_checkpoints(cfg)
    if given:
        return {"checkpoints": {d: str(p) for d, p in given.items()}}
    return {"model": asdict(cfg.teacher.model), "train": train_key(cfg.teacher.train), **PAIR}


def distill_key(cfg: PipelineConfig) -> dict[str, Any]:
    """What changes distill's output: the given corpus, or the decoding options and the engine (named only when
    it is CTranslate2, so directories made by our search keep their names; `auto` as resolved on this driver).
    Not the batching (`max_tokens`, `batch_size`) nor the actors: they change no output."""
    if cfg.distill.corpus:
        source = {"corpus": str(Path(cfg.distill.corpus).expanduser().resolve())}
    else:
        source = {"decoding": {k: getattr(cfg.distill, k) for k in distill.DECODING_KEYS}}
        if distill.engine(cfg.distill) == "ctranslate2":
            source["engine"] = "ctranslate2"
    return {**source, "feasibility": feasibility.key(cfg.model)}


def decoding_key(cfg: PipelineConfig) -> dict[str, Any]:
    """What the train stage (and a sweep's trials) decode validation with beyond the defaults from before the blank penalty existed:
    the grid of blank penalties it tunes (`evaluate.blank_penalties`), named unless it is [0], the behaviour
    from before it (so a run that asks for no penalty keeps its directory; the default grid trains anew)."""
    penalties = cfg.evaluate.blank_penalties
    if penalties == NO_BLANK_PENALTY or not EMITS_BLANK[cfg.model.head]:  # DAG: no penalty
        return {}
    return {"blank_penalties": list(penalties)}


def references_key(cfg: PipelineConfig) -> dict[str, Any]:
    """Whether REDER trains on the references beside the distilled pairs (`distill.references`), named only
    when it does, so the directories made before the option keep their names."""
    return {"distill_references": True} if cfg.distill.enabled and cfg.distill.references else {}


def train_stage_key(cfg: PipelineConfig) -> dict[str, Any]:
    """REDER's model, loss and train sections, the blank penalties it tunes and whether it trains on the
    references beside the distilled pairs."""
    return {"model": section_key("model", cfg.model), "loss": section_key("loss", cfg.loss),
            "train": train_key(cfg.train), **decoding_key(cfg), **references_key(cfg)}


def cmlm_key(cfg: PipelineConfig) -> dict[str, Any]:
    """The CMLMs' model and train sections (and `PAIR`)."""
    return {"model": asdict(cfg.cmlm.model), "train": train_key(cfg.cmlm.train), **PAIR}


def evaluate_key(cfg: PipelineConfig) -> dict[str, Any]:
    """The evaluate section as it was hashed before the reranking options, so finished evaluations keep their directories:
    `rerank` none/teacher as the old `rerank_with_teacher` bool (self as `rerank`), the ADDED_LATER keys
    only where they differ from the value they were added with; named test sets by their files' SHA-256; and
    where a CTC model's beam decoders get penalties of their own (a beam, a grid other than [0]), that they do:
    evaluations from before decoded the beam under greedy's."""
    key = section_key("evaluate", cfg.evaluate)
    key.pop("blank_penalties")  # the train stage tunes it into the model directory: its key (and name) has it
    if "test_sets" in key:  # named test sets with their files' SHA-256: a changed file is a new evaluation
        key["test_sets"] = evaluate.test_sets_key(cfg)
    rerank = key.pop("rerank")
    key["rerank_with_teacher"] = rerank == "teacher"
    if rerank == "self":
        key["rerank"] = rerank
    if cfg.evaluate.beam_size > 1 and decoding_key(cfg):  # the beam decoders' own penalties, tuned on valid
        key["beam_blank_penalty"] = "valid"
    return {"evaluate": key}


def tune_key(cfg: PipelineConfig) -> dict[str, Any]:
    """The tune section without its watchdog (`time_budget_s`: a resumed sweep may get another budget), and the
    sections a trial trains with."""
    return {"tune": {k: v for k, v in asdict(cfg.tune).items() if k != "time_budget_s"},
            "model": section_key("model", cfg.model), "loss": section_key("loss", cfg.loss),
            "train": section_key("train", cfg.train), **decoding_key(cfg), **references_key(cfg)}
