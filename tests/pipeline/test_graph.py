"""The stage graph: output directories as the stages had them before the graph (pinned), when a stage is
needed, and import arrows that follow the run order."""
import ast
import dataclasses
import json
import math
from pathlib import Path

import pytest

from pipeline import graph, stagekeys
from pipeline.config import ConfigError, load_config
from pipeline.stage import StageError
from pipeline.stages import distill

PIPELINE_DIR = Path(graph.__file__).resolve().parent
# A corpus path that exists nowhere: the ingest key then holds no file fingerprint, so these names are the
# same on every machine. The names are those the per-stage output_dir functions computed before the graph,
# but evaluate's: `evaluate.measure_speed` joined its key, so earlier evaluate outputs are redone;
# and a trained teacher's: both directions now train in one Ray Train run (stagekeys.PAIR in its key: one
# random stream for both models, so other teachers), which renames the teacher stage and every stage downstream of
# it (distill when it decodes with the teachers, train and tune on its output, evaluate when it reads the teachers).
BASE = ["data.source=files", "data.local_dir=/nonexistent/corpus"]
UNPENALISED = ["evaluate.blank_penalties=[0]"]  # untuned decoding, which the pinned names were made with
PINNED = [
    ([],
     {'ingest': 'ingest-19b97460c2e8', 'spm': 'spm-329019bbf169', 'tokenize': 'tokenize-0d52ee35e7d7', 'teacher': 'teacher-173c547875b1', 'distill': 'distill-ea17b84f42c6', 'train': 'train-76b31c676f11', 'evaluate': 'evaluate-2c7df1923a6d', 'tune': 'tune-a0a115863eb5'}),
    (['model.head=dag', 'model.graph_upsample_ratio=4'],
     {'ingest': 'ingest-19b97460c2e8', 'spm': 'spm-329019bbf169', 'tokenize': 'tokenize-411c7ec1ee9c', 'teacher': 'teacher-298c55aad7ab', 'distill': 'distill-147ed3614f62', 'train': 'train-da34ccadcb81', 'evaluate': 'evaluate-1d9b62d6e3d0', 'tune': 'tune-37f1c4a2a95e'}),
    (['distill.corpus=/nonexistent/kd'],
     {'ingest': 'ingest-19b97460c2e8', 'spm': 'spm-329019bbf169', 'tokenize': 'tokenize-0d52ee35e7d7', 'teacher': 'teacher-173c547875b1', 'distill': 'distill-40455ad8320b', 'train': 'train-8c8340c38e60', 'evaluate': 'evaluate-aa5fb6448256', 'tune': 'tune-4bcae5d32a08'}),
    (['teacher.src2tgt_checkpoint=/nonexistent/a', 'teacher.tgt2src_checkpoint=/nonexistent/b'],
     {'ingest': 'ingest-19b97460c2e8', 'spm': 'spm-329019bbf169', 'tokenize': 'tokenize-0d52ee35e7d7', 'teacher': 'teacher-7eabf7ec004d', 'distill': 'distill-879799dc3bc4', 'train': 'train-bad4edb4d672', 'evaluate': 'evaluate-8211c8702166', 'tune': 'tune-ed9d6de9fcc9'}),
    (['distill.enabled=false', 'evaluate.teacher_baseline=false'],
     {'ingest': 'ingest-19b97460c2e8', 'spm': 'spm-329019bbf169', 'tokenize': 'tokenize-0d52ee35e7d7', 'teacher': 'teacher-173c547875b1', 'distill': 'distill-ea17b84f42c6', 'train': 'train-f7a5b49913c7', 'evaluate': 'evaluate-f755340feeed', 'tune': 'tune-afe5ed4704c7'}),
]


@pytest.mark.parametrize("overrides, names", PINNED)
def test_output_directories_keep_the_names_they_had_before_the_graph(tmp_path, overrides, names, monkeypatch):
    monkeypatch.setattr(distill, "ctranslate2_installed", lambda: False)  # distill.engine auto = our beam search
    dirs = graph.output_dirs(load_config(None, BASE + UNPENALISED + overrides), tmp_path)
    assert {stage: path.name for stage, path in dirs.items() if stage not in graph.OPTIONAL} == names
    assert set(dirs) - set(names) == set(graph.OPTIONAL)  # stages added later (cmlm) come on top
    assert all(path.parent == tmp_path.resolve() for path in dirs.values())


def test_the_blank_penalty_grid_names_the_ctc_training_and_what_follows_it(tmp_path, monkeypatch):
    """The default grid of evaluate.blank_penalties changes what the train stage publishes (a tuned
    penalty) and which checkpoints it keeps, so it moves train, evaluate and tune — and nothing for a DAG model,
    which has no blank to penalise; [0] keeps the names of before."""
    monkeypatch.setattr(distill, "ctranslate2_installed", lambda: False)
    for head in ([], ["model.head=dag", "model.graph_upsample_ratio=4"]):
        before = graph.output_dirs(load_config(None, BASE + UNPENALISED + head), tmp_path)
        for grid in ([], ["evaluate.blank_penalties=[0, 2]"]):
            changed = graph.output_dirs(load_config(None, BASE + head + grid), tmp_path)
            assert [s for s in before if before[s] != changed[s]] == (["train", "evaluate", "tune"] if not head else []), grid
    assert graph.output_dirs(load_config(None, BASE), tmp_path) != graph.output_dirs(
        load_config(None, BASE + ["evaluate.blank_penalties=[0, 2]"]), tmp_path)


def test_the_cmlm_stage_is_off_by_default_and_moves_no_directory(tmp_path, monkeypatch):
    """The cmlm stage is needed only for the evaluation's CMLM decoders; asking for them changes the
    evaluate directory alone (and the cmlm stage, downstream of the training data, follows its own sections)."""
    monkeypatch.setattr(distill, "ctranslate2_installed", lambda: False)
    base = graph.output_dirs(load_config(None, BASE), tmp_path)
    # pinned from here on; renamed since (stagekeys.PAIR: both directions in one run; and distill's new name)
    assert base["cmlm"].name == "cmlm-1d091f076cee"
    assert "cmlm" not in graph.needed(load_config(None, BASE)) and "cmlm" not in graph.pipeline_stages(load_config(None, BASE))
    for asked in (["evaluate.refine_steps=[1,2]"], ["evaluate.cmlm_iterations=[1,4,10]", "evaluate.cmlm_length_beam=3"]):
        cfg = load_config(None, BASE + asked)
        changed = graph.output_dirs(cfg, tmp_path)
        assert [s for s in base if base[s] != changed[s]] == ["evaluate"], asked
        assert "cmlm" in graph.needed(cfg) and graph.pipeline_stages(cfg) == list(graph.PIPELINE)
        assert graph.upstream(cfg, "cmlm") == {"data": "distill", "tokenize": "tokenize", "ingest": "ingest", "spm": "spm"}
    changed = graph.output_dirs(load_config(None, BASE + ["cmlm.train.max_steps=7", "cmlm.model.d_model=64"]), tmp_path)
    assert [s for s in base if base[s] != changed[s]] == ["cmlm"]  # not asked for: evaluate unchanged
    changed = graph.output_dirs(load_config(None, BASE + ["distill.enabled=false"]), tmp_path)
    assert changed["cmlm"] != base["cmlm"]  # the references instead of the KD pairs


def test_a_change_reaches_exactly_the_stages_downstream_of_it(tmp_path):
    base = graph.output_dirs(load_config(None, BASE), tmp_path)
    changed = graph.output_dirs(load_config(None, BASE + ["spm.model_type=unigram"]), tmp_path)
    assert [s for s in base if base[s] != changed[s]] == ["spm", "tokenize", "teacher", "distill", "train", "cmlm", "evaluate",
                                                          "tune"]
    changed = graph.output_dirs(load_config(None, BASE + ["evaluate.beam_size=3"]), tmp_path)
    assert [s for s in base if base[s] != changed[s]] == ["evaluate"]
    for new in ("evaluate.rerank=self", "evaluate.rerank_weight=0.5", "evaluate.cutoff_top_n=20", "evaluate.cutoff_prob=0.99"):
        changed = graph.output_dirs(load_config(None, BASE + [new]), tmp_path)  # beam and rerank keys: hashed off their defaults
        assert [s for s in base if base[s] != changed[s]] == ["evaluate"], new
    assert graph.output_dirs(load_config(None, BASE + ["model.dag_dp=auto"]), tmp_path) == base  # the Triton DP's key
    for dp in ("torch", "triton"):
        changed = graph.output_dirs(load_config(None, BASE + [f"model.dag_dp={dp}"]), tmp_path)
        assert [s for s in base if base[s] != changed[s]] == ["train", "evaluate", "tune"], dp
    changed = graph.output_dirs(load_config(None, BASE + ["train.log_every=7", "tokenize.workers=3"]), tmp_path)
    assert [s for s in base if base[s] != changed[s]] == ["tune"]  # only the sweep hashes its whole train section
    # a run that stopped for a lost host finds its checkpoints with min_workers set (elastic)
    two = graph.output_dirs(load_config(None, BASE + ["train.num_workers=2"]), tmp_path)
    changed = graph.output_dirs(load_config(None, BASE + ["train.num_workers=2", "train.min_workers=1"]), tmp_path)
    assert [s for s in two if two[s] != changed[s]] == ["tune"]


def test_the_distill_engine_names_its_output_only_when_it_is_ctranslate2(tmp_path, monkeypatch):
    monkeypatch.setattr(distill, "ctranslate2_installed", lambda: False)
    ours = graph.output_dirs(load_config(None, BASE), tmp_path)
    assert graph.output_dirs(load_config(None, BASE + ["distill.engine=torch"]), tmp_path) == ours
    with pytest.raises(StageError, match=r"distill.engine=ctranslate2 but CTranslate2 is not installed: pip install"):
        graph.output_dirs(load_config(None, BASE + ["distill.engine=ctranslate2"]), tmp_path)
    monkeypatch.setattr(distill, "ctranslate2_installed", lambda: True)
    converted = graph.output_dirs(load_config(None, BASE + ["distill.engine=ctranslate2"]), tmp_path)
    assert graph.output_dirs(load_config(None, BASE), tmp_path) == converted  # auto takes the installed extra
    assert [s for s in ours if ours[s] != converted[s]] == ["distill", "train", "cmlm", "evaluate", "tune"]
    assert graph.output_dirs(load_config(None, BASE + ["distill.engine=torch"]), tmp_path) == ours


def test_needed_follows_what_the_targets_consume():
    def needed(*overrides, targets=("evaluate",)):
        return graph.needed(load_config(None, list(overrides)), targets)

    everything = ["ingest", "spm", "tokenize", "teacher", "distill", "train", "evaluate"]
    assert needed() == everything
    off = ["distill.enabled=false", "evaluate.teacher_baseline=false"]
    assert needed(*off) == ["ingest", "spm", "tokenize", "train", "evaluate"]
    assert needed("distill.enabled=true", "evaluate.teacher_baseline=false") == everything
    assert needed("distill.corpus=/data/kd", "evaluate.teacher_baseline=false") == \
        ["ingest", "spm", "tokenize", "distill", "train", "evaluate"]
    assert needed(*off[:1]) == ["ingest", "spm", "tokenize", "teacher", "train", "evaluate"]
    assert needed(*off, "evaluate.rerank=teacher") == ["ingest", "spm", "tokenize", "teacher", "train", "evaluate"]
    assert needed(targets=("tune",)) == ["ingest", "spm", "tokenize", "teacher", "distill", "tune"]
    assert needed(*off, targets=("tune",)) == ["ingest", "spm", "tokenize", "tune"]


def test_a_stage_without_its_inputs_says_which_to_run_first(tmp_path):
    cfg = load_config(None, BASE + [f"workdir={tmp_path}"])
    with pytest.raises(StageError, match="stage 'ingest' has no finished output"):
        graph.run(cfg, tmp_path, "spm")


def _imports(path: Path) -> set[str]:
    """The pipeline modules a pipeline module imports (at any depth of its code)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module in ("pipeline", "pipeline.stages", "pipeline.training"):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline."):
            found.add(_module(node.module))
        elif isinstance(node, ast.Import):
            found.update(_module(a.name) for a in node.names if a.name.startswith("pipeline."))
    return found


def _module(dotted: str) -> str:
    """The pipeline module a dotted name is in: `pipeline.stages.spm.X` → spm, `pipeline.graph` → graph."""
    parts = dotted.split(".")
    return parts[2] if parts[1] in ("stages", "training") and len(parts) > 2 else parts[1]


def test_stage_modules_import_only_stages_that_run_before_them():
    order = list(graph.PIPELINE) + ["tune"]
    for name in order:
        module = PIPELINE_DIR / "stages" / f"{name}.py"
        files = [module] if module.is_file() else sorted((PIPELINE_DIR / "stages" / name).glob("*.py"))  # a package
        assert files, f"no stage module pipeline/stages/{name}"
        imported = set().union(*(_imports(path) for path in files))
        later = set(order[order.index(name) + 1:])
        assert not imported & later, f"pipeline.{name} imports later stage(s) {sorted(imported & later)}"
        assert "graph" not in imported, f"pipeline.{name} imports the graph (the graph imports the stages)"


def test_force_reaches_the_stage_build(tmp_path, monkeypatch):
    seen = []

    def build(run, tmp):
        seen.append(run.force)
        return {}

    monkeypatch.setitem(graph.BY_NAME, "ingest", dataclasses.replace(graph.BY_NAME["ingest"], build=build))
    cfg = load_config(None, BASE + [f"workdir={tmp_path}"])
    graph.run(cfg, tmp_path, "ingest")
    graph.run(cfg, tmp_path, "ingest")  # finished: skipped
    graph.run(cfg, tmp_path, "ingest", force=True)
    assert seen == [False, True]


def test_keys_added_later_are_hashed_only_away_from_their_defaults(tmp_path):
    """loss.fba_start_step / cc_start_step / directions and train.batch_tokens: set to their defaults
    (today's behaviour) the names stay those pinned above; set otherwise they reach exactly the stages that
    hash their section."""
    base = graph.output_dirs(load_config(None, BASE), tmp_path)
    explicit = ["loss.fba_start_step=null", "loss.cc_start_step=null", "loss.directions=[src2tgt, tgt2src]",
                "train.batch_tokens=sum", "teacher.train.batch_tokens=sum"]
    assert graph.output_dirs(load_config(None, BASE + explicit), tmp_path) == base
    for override, reached in (("loss.fba_start_step=5", ["train", "evaluate", "tune"]),
                              ("loss.cc_start_step=0", ["train", "evaluate", "tune"]),
                              ("loss.directions=[src2tgt]", ["train", "evaluate", "tune"]),
                              ("train.batch_tokens=max", ["train", "evaluate", "tune"]),
                              ("teacher.train.batch_tokens=max", ["teacher", "distill", "train", "cmlm", "evaluate", "tune"])):
        changed = graph.output_dirs(load_config(None, BASE + [override]), tmp_path)
        assert [s for s in base if base[s] != changed[s]] == reached, override


def test_a_run_budget_leaves_each_later_training_stage_its_max_time_and_the_reserve():
    """budget.max_time shared: the teacher stage gets the run's time left less train's max_time and the
    reserve (cmlm is not named as later: not in this run); a later stage without a max_time claims nothing;
    no run budget, no cap; never below 0."""
    cfg = load_config(None, ["budget.max_time=540", "budget.reserve=90", "teacher.train.max_time=200",
                             "train.max_time=250"])
    assert graph.time_cap(cfg, "teacher", ["distill", "train", "evaluate"], 530.0) == 530.0 - 250.0 - 90.0
    assert graph.time_cap(cfg, "train", ["evaluate"], 260.0) == 260.0 - 90.0
    assert graph.time_cap(cfg, "distill", ["train"], 260.0) == math.inf  # not a training stage
    assert graph.time_cap(cfg, "train", [], 50.0) == 0.0
    unclaimed = load_config(None, ["budget.max_time=540", "budget.reserve=90"])
    assert graph.time_cap(unclaimed, "teacher", ["distill", "train", "evaluate"], 530.0) == 440.0
    assert graph.time_cap(load_config(None, []), "train", [], 1.0) == math.inf


def test_time_budget_keys_name_the_train_stage_only_when_set():
    """max_time, patience, lr_scheduler and warmup_fraction re-key the train stage only away from their
    defaults (a run budgeted by time says so in its key); budget.* is in no stage's key."""
    workdir = Path("/w")
    plain = graph.output_dirs(load_config(None, []), workdir)
    budgeted = graph.output_dirs(load_config(None, ["train.max_time=60"]), workdir)
    shared = graph.output_dirs(load_config(None, ["budget.max_time=600", "budget.reserve=60"]), workdir)
    assert budgeted["train"] != plain["train"] and budgeted["tokenize"] == plain["tokenize"]
    assert shared == plain
    assert "max_time" in stagekeys.train_key(load_config(None, ["train.max_time=60"]).train)
    assert "max_time" not in stagekeys.train_key(load_config(None, []).train)


def test_training_on_the_references_beside_the_distilled_pairs_re_keys_the_train_stage_alone():
    """distill.references is the train stage's data, not distill's output: it names the train stage (and what
    follows) only when set, and it needs distillation."""
    workdir = Path("/w")
    plain = graph.output_dirs(load_config(None, []), workdir)
    both = graph.output_dirs(load_config(None, ["distill.references=true"]), workdir)
    assert both["distill"] == plain["distill"] and both["train"] != plain["train"]
    assert stagekeys.train_stage_key(load_config(None, ["distill.references=true"]))["distill_references"] is True
    assert "distill_references" not in stagekeys.train_stage_key(load_config(None, []))
    with pytest.raises(ConfigError, match="distill.references: .* needs distill.enabled=true"):
        load_config(None, ["distill.references=true", "distill.enabled=false"])


def test_keys_added_later_record_the_value_they_were_added_with_which_is_today_s_default():
    """stagekeys.ADDED_LATER holds each key with the value it was added with (hashed only away from it): today
    that is every key's default. A changed default fails here on purpose: the new default is then hashed, so it
    re-keys the stages that hash its section and what follows them, nothing else (as any value away from the
    recorded one does, test above); update the pinned names deliberately and say so."""
    cfg = load_config(None, [])
    for section, added in stagekeys.ADDED_LATER.items():
        values = dataclasses.asdict(getattr(cfg, section))
        for key, value in added.items():
            assert values[key] == value, f"{section}.{key}"


def test_the_plan_says_per_stage_whether_it_runs_or_reuses_and_why(tmp_path, monkeypatch):
    """run_pipeline.py --dry-run: a finished directory is reused; a stage without one runs, naming the keys in
    which the nearest finished directory of the stage differs; a stage the run does not need says which keys
    decide that."""
    monkeypatch.setattr(distill, "ctranslate2_installed", lambda: False)
    cfg = load_config(None, BASE + ["distill.enabled=false", "evaluate.teacher_baseline=false"])
    dirs = graph.output_dirs(cfg, tmp_path)
    old = tmp_path / "ingest-000000000000"  # an ingest of other data: data.limit differed
    old.mkdir()
    record = {"data": {**dataclasses.asdict(cfg.data), "limit": 7}, "files": {}}
    (old / "manifest.json").write_text(json.dumps({"stage": "ingest", "config": record, "inputs": {}}))
    (old / "_SUCCESS").touch()
    steps = {step.name: step for step in graph.plan(cfg, tmp_path, graph.pipeline_stages(cfg))}
    assert steps["ingest"].action == "run" and "data.limit" in steps["ingest"].reason
    assert steps["ingest"].reason.startswith(f"nearest finished {old.name} differs in")
    assert steps["spm"].action == "run" and steps["spm"].reason == "no finished directory of this stage"
    assert steps["teacher"].action == "not needed" and "evaluate.teacher_baseline=False" in steps["teacher"].reason
    assert "cmlm" not in steps and graph.why_not_needed(cfg, "cmlm") == "evaluate.cmlm_iterations=[], evaluate.refine_steps=[]"
    dirs["ingest"].mkdir()
    (dirs["ingest"] / "_SUCCESS").touch()
    reused = graph.plan(cfg, tmp_path, ["ingest"])[0]
    assert (reused.action, reused.output) == ("reuse", dirs["ingest"])
    assert graph.plan(cfg, tmp_path, ["ingest"], force=True)[0].reason == "--force"
