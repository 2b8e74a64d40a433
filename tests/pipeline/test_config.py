import re
from pathlib import Path

import pytest

from pipeline.config import ConfigError, DataConfig, PipelineConfig, from_dict, load_config, to_yaml
from reder.config import ModelConfig
from reder.heads import head_class

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml"


def test_configs_directory_is_not_empty():
    assert {p.name for p in CONFIGS} >= {"default.yaml", "smoke.yaml", "multi30k.yaml", "wmt16_enro.yaml",
                                         "wmt14_ende.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_yaml_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, PipelineConfig)
    assert isinstance(cfg.model, ModelConfig)
    assert cfg.model.vocab_size >= 64
    if cfg.data.local_dir:  # resolved against the YAML file, not the current directory
        assert Path(cfg.data.local_dir).is_absolute()


def test_defaults_come_from_the_dataclasses():
    cfg = load_config(None)
    assert cfg.data == DataConfig()
    assert cfg.model == ModelConfig()
    assert cfg.data.source == "sword"


def test_overrides_are_parsed_and_typed():
    cfg = load_config(None, ["model.vocab_size=4000", "model.dropout=0.3", "data.lenient=true",
                             "data.source=multi30k", "data.src_lang=de", "spm.model_type=unigram",
                             "loss.lambda_fba=1e-3", "data.max_length_ratio=2"])
    assert cfg.model.vocab_size == 4000 and isinstance(cfg.model.vocab_size, int)
    assert cfg.model.dropout == 0.3
    assert cfg.data.lenient is True
    assert cfg.data.source == "multi30k" and cfg.data.src_lang == "de"
    assert cfg.spm.model_type == "unigram"
    assert cfg.loss.lambda_fba == pytest.approx(1e-3)
    assert cfg.data.max_length_ratio == 2.0 and isinstance(cfg.data.max_length_ratio, float)


@pytest.mark.parametrize("override, fragment", [
    ("data.bogus=1", "data.bogus"),
    ("bogus=1", "bogus"),
    ("model.vocab_size=lots", "model.vocab_size: expected int, got str"),
    ("model.vocab_size=1.5", "model.vocab_size: expected int, got float"),
    ("data.lenient=3", "data.lenient: expected bool"),
    ("data.source=europarl", "data.source: expected one of"),
    ("data.max_chars.deep=1", "data.max_chars"),
    ("model.n_heads=3", "model.n_heads: must be a positive divisor of model.d_model (512), got 3"),
    ("noequals", "expected dotted.key=value"),
    ("workdir=", "workdir: must not be empty"),
    ("workdir=' '", "workdir: must not be empty"),
])
def test_bad_overrides_name_the_key(override, fragment):
    with pytest.raises(ConfigError) as error:
        load_config(None, [override])
    assert fragment in str(error.value)


def test_bad_yaml_names_the_key_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("data:\n  max_chars: many\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"data\.max_chars: expected int, got str 'many'"):
        load_config(path)
    path.write_text("model:\n  vocab_size: 100\n  hidden: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model\.hidden"):
        load_config(path)
    path.write_text("data: [1, 2]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"data: expected a mapping"):
        load_config(path)


def test_model_and_loss_sections_go_through_the_same_typed_loader(tmp_path):
    """reder's configs are loaded by the pipeline's one loader: their errors carry the section path."""
    path = tmp_path / "bad.yaml"
    for text, message in [
        ("model:\n  dropout: high\n", r":2: model\.dropout: expected float, got str 'high'$"),
        ("teacher:\n  model:\n    encoder_layers: 2.5\n", r":3: teacher\.model\.encoder_layers: expected int, got float 2\.5$"),
        ("loss:\n  aux_start_step: '10'\n", r":2: loss\.aux_start_step: expected int, got str '10'$"),
        ("model:\n  d_modle: 8\n", r":2: model: unknown keys \['model\.d_modle'\]; known keys are \[.*'d_model'"),
        ("teacher:\n  model:\n    layers: 2\n", r":3: teacher\.model: unknown keys \['teacher\.model\.layers'\]"),
    ]:
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}{message}"):
            load_config(path)
    path.write_text("model:\n  head: dag\n  graph_upsample_ratio: 4\n", encoding="utf-8")
    cfg = load_config(path)
    assert cfg.model.graph_upsample_ratio == 4.0 and isinstance(cfg.model.graph_upsample_ratio, float)
    assert load_config(None, ["model.dropout=0"]).model.dropout == 0.0


def test_a_resolved_config_loads_back_identically(tmp_path):
    cfg = load_config(CONFIGS[0], ["train.adam_betas=[0.9, 0.99]", "tune.space={train.lr: {grid: [0.001, 0.002]}}"])
    path = tmp_path / "resolved.yaml"
    path.write_text(to_yaml(cfg), encoding="utf-8")
    assert load_config(path) == cfg and from_dict(PipelineConfig, cfg.to_dict()) == cfg


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_vocab_size_has_one_source_of_truth():
    with pytest.raises(ConfigError, match="model.vocab_size"):
        load_config(None, ["model.vocab_size=32"])
    with pytest.raises(ConfigError, match="spm.vocab_size"):
        load_config(None, ["spm.vocab_size=8000"])  # not a key: the size lives in model.vocab_size


def test_train_and_evaluate_sections_are_checked():
    default = load_config(Path(__file__).resolve().parents[2] / "configs" / "default.yaml")
    assert default.evaluate.splits == ("test",) and default.train.adam_betas == (0.9, 0.98)
    for recipe in ("wmt14_ende.yaml", "wmt16_enro.yaml"):  # the paper's: stage two after a first stage
        paper = load_config(Path(__file__).resolve().parents[2] / "configs" / recipe)
        assert 0 < paper.loss.aux_start_step < paper.train.max_steps
        assert paper.loss.lambda_fba > 0 and paper.loss.lambda_cc > 0
    with pytest.raises(ConfigError, match="average_best"):
        load_config(None, ["train.keep_checkpoints=2", "train.average_best=3"])
    with pytest.raises(ConfigError, match="splits"):
        load_config(None, ["evaluate.splits=[dev]"])
    with pytest.raises(ConfigError, match="train.max_token"):
        load_config(None, ["train.max_token=10"])
    with pytest.raises(ConfigError, match="placement_strategy"):
        load_config(None, ["train.placement_strategy=SCATTER"])
    assert load_config(None, ["train.placement_strategy=SPREAD"]).train.placement_strategy == "SPREAD"


def test_unreadable_yaml_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lr: 1e-3\n  max_steps: [1, 2\nmodel: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{path}:4:6: invalid YAML \(expected ',' or '\]', but got ':'\); fix"):
        load_config(path)
    path.write_bytes(b"train:\n  lr: 0.001  # caf\xe9\n")  # Latin-1, not UTF-8
    with pytest.raises(ConfigError, match=rf"^{path}:2: not UTF-8 \(invalid continuation byte at byte 25\)"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"^override 'train.lr=\[1,': invalid YAML"):
        load_config(None, ["train.lr=[1,"])


@pytest.mark.parametrize("override, message", [
    ("train.lr=.inf", r"^train\.lr: expected a finite number, got inf$"),
    ("train.lr=.nan", r"^train\.lr: expected a finite number, got nan$"),
    ("teacher.train.adam_betas=[0.9, .inf]", r"^teacher\.train\.adam_betas\[1\]: expected a finite number"),
    ("model.dropout=-.inf", r"^model\.dropout: expected a finite number, got -inf$"),
    ("data.max_length_ratio=1e400", r"^data\.max_length_ratio: expected a finite number, got inf$"),
    ("tune.space={train.lr: {uniform: [0.1, .inf]}}", r"tune\.space\.train\.lr: values must be finite numbers"),
    ("model.max_positions=0", r"^model\.max_positions: must be >= 2 \(.*\), got 0$"),
    (("model.upsample_ratio=4", "model.max_positions=3"),
     r"^model\.max_positions: must be >= 4 \(.*upsampled by model\.upsample_ratio \(4\) for head 'ctc'\), got 3$"),
    (("model.head=dag", "model.max_positions=15"),
     r"^model\.max_positions: must be >= 16 \(.*model\.graph_upsample_ratio \(8\.0\) for head 'dag'\), got 15$"),
    ("train.cpus_per_worker=-1", r"^train\.cpus_per_worker: must be > 0, got -1\.0$"),
    ("train.cpus_per_worker=0", r"^train\.cpus_per_worker: must be > 0, got 0\.0$"),
    ("ray.num_cpus=-1", r"^ray\.num_cpus: must be >= 0, got -1$"),
    ("data.max_input_mb=0", r"^data\.max_input_mb: must be >= 1, got 0$"),
])
def test_out_of_range_values_are_rejected_with_the_key_path(override, message):
    """Values that used to load and fail later (or never): non-finite floats anywhere, sizes and resources."""
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override] if isinstance(override, str) else list(override))


def test_the_smallest_max_positions_fits_an_eos_only_input():
    for overrides in (["model.upsample_ratio=4", "model.max_positions=4"],
                      ["model.head=dag", "model.max_positions=16"]):
        model = load_config(None, overrides).model
        assert head_class(model.head)(model).max_input_length() == 1


# One bad value for every checked field of every section (smoke.yaml: model.d_model 32, model.n_heads 2,
# train.keep_checkpoints 3, teacher.train.keep_checkpoints 2), then the cross-section checks.
FIELD_ERRORS = [
    ("model.vocab_size=4", "model.vocab_size", "4"),
    ("model.d_model=0", "model.d_model", "0"),
    ("model.n_heads=0", "model.n_heads", "0"),
    ("model.n_heads=3", "model.n_heads", "3"),
    ("model.dropout=1", "model.dropout", "1.0"),
    ("model.attention_dropout=-0.1", "model.attention_dropout", "-0.1"),
    ("model.label_smoothing=1", "model.label_smoothing", "1.0"),
    ("model.ffn_dim=0", "model.ffn_dim", "0"),
    ("model.layers_per_end=0", "model.layers_per_end", "0"),
    ("model.upsample_ratio=0", "model.upsample_ratio", "0"),
    ("model.max_relative_distance=0", "model.max_relative_distance", "0"),
    ("model.head=crf", "model.head", "'crf'"),
    ("model.graph_upsample_ratio=0.5", "model.graph_upsample_ratio", "0.5"),
    ("model.link_heads=3", "model.link_heads", "3"),
    ("model.max_positions=1", "model.max_positions", "1"),
    (("model.head=dag", "model.max_positions=15"), "model.max_positions", "15"),
    ("teacher.model.vocab_size=4", "teacher.model.vocab_size", "4"),
    ("teacher.model.d_model=0", "teacher.model.d_model", "0"),
    ("teacher.model.n_heads=0", "teacher.model.n_heads", "0"),
    ("teacher.model.dropout=1", "teacher.model.dropout", "1.0"),
    ("teacher.model.attention_dropout=1", "teacher.model.attention_dropout", "1.0"),
    ("teacher.model.label_smoothing=-0.1", "teacher.model.label_smoothing", "-0.1"),
    (("teacher.model.n_heads=1", "teacher.model.d_model=33"), "teacher.model.d_model", "33"),
    ("teacher.model.ffn_dim=0", "teacher.model.ffn_dim", "0"),
    ("teacher.model.encoder_layers=0", "teacher.model.encoder_layers", "0"),
    ("teacher.model.decoder_layers=0", "teacher.model.decoder_layers", "0"),
    ("teacher.model.max_positions=1", "teacher.model.max_positions", "1"),
    ("loss.lambda_fba=-1", "loss.lambda_fba", "-1.0"),
    ("loss.lambda_cc=-0.5", "loss.lambda_cc", "-0.5"),
    ("loss.aux_start_step=-1", "loss.aux_start_step", "-1"),
    ("data.tgt_lang=en", "data.tgt_lang", "'en'"),
    ("data.limit=-1", "data.limit", "-1"),
    ("data.max_chars=0", "data.max_chars", "0"),
    ("data.max_length_ratio=0.5", "data.max_length_ratio", "0.5"),
    ("data.valid_size=-1", "data.valid_size", "-1"),
    ("data.test_size=-1", "data.test_size", "-1"),
    ("data.max_input_mb=0", "data.max_input_mb", "0"),
    ("spm.character_coverage=0.5", "spm.character_coverage", "0.5"),
    ("spm.sample_size=0", "spm.sample_size", "0"),
    ("spm.num_threads=0", "spm.num_threads", "0"),
    ("tokenize.workers=-1", "tokenize.workers", "-1"),
    ("tokenize.batch_size=0", "tokenize.batch_size", "0"),
    ("ray.num_cpus=-1", "ray.num_cpus", "-1"),
    ("ray.object_store_memory_mb=-1", "ray.object_store_memory_mb", "-1"),
    ("train.num_workers=0", "train.num_workers", "0"),
    ("train.cpus_per_worker=0", "train.cpus_per_worker", "0.0"),
    ("train.gpus_per_worker=0", "train.gpus_per_worker", "0.0"),
    ("train.max_tokens=0", "train.max_tokens", "0"),
    ("train.update_freq=0", "train.update_freq", "0"),
    ("train.max_steps=0", "train.max_steps", "0"),
    ("train.lr=0", "train.lr", "0.0"),
    ("train.warmup_steps=-1", "train.warmup_steps", "-1"),
    ("train.warmup_init_lr=-1e-7", "train.warmup_init_lr", "-1e-07"),
    ("train.adam_betas=[0.9, 1.0]", "train.adam_betas", "[0.9, 1.0]"),
    ("train.adam_betas=[0.9]", "train.adam_betas", "[0.9]"),
    ("train.adam_eps=0", "train.adam_eps", "0.0"),
    ("train.weight_decay=-0.1", "train.weight_decay", "-0.1"),
    ("train.clip_norm=-1", "train.clip_norm", "-1.0"),
    ("train.log_every=0", "train.log_every", "0"),
    ("train.validate_every=0", "train.validate_every", "0"),
    ("train.valid_max_sentences=-1", "train.valid_max_sentences", "-1"),
    ("train.keep_checkpoints=0", "train.keep_checkpoints", "0"),
    ("train.average_best=0", "train.average_best", "0"),
    ("train.average_best=4", "train.average_best", "4"),
    ("train.max_failures=-2", "train.max_failures", "-2"),
    ("train.fail_at_step=-1", "train.fail_at_step", "-1"),
    ("train.start_timeout_s=0", "train.start_timeout_s", "0.0"),
    ("train.placement_strategy=SCATTER", "train.placement_strategy", "'SCATTER'"),
    ("teacher.train.gpus_per_worker=-1", "teacher.train.gpus_per_worker", "-1.0"),
    ("teacher.train.average_best=3", "teacher.train.average_best", "3"),
    ("teacher.src2tgt_checkpoint=/x", "teacher.tgt2src_checkpoint", "''"),
    ("teacher.tgt2src_checkpoint=/x", "teacher.src2tgt_checkpoint", "''"),
    ("distill.beam_size=0", "distill.beam_size", "0"),
    ("distill.max_len_a=-1", "distill.max_len_a", "-1.0"),
    ("distill.max_len_b=-1", "distill.max_len_b", "-1"),
    ("distill.batch_size=0", "distill.batch_size", "0"),
    ("distill.workers=-1", "distill.workers", "-1"),
    ("distill.cpus_per_worker=0", "distill.cpus_per_worker", "0.0"),
    ("evaluate.splits=[dev]", "evaluate.splits", "['dev']"),
    ("evaluate.splits=[]", "evaluate.splits", "[]"),
    ("evaluate.beam_size=0", "evaluate.beam_size", "0"),
    ("evaluate.batch_size=0", "evaluate.batch_size", "0"),
    ("evaluate.max_sentences=-1", "evaluate.max_sentences", "-1"),
    ("evaluate.latency_sentences=-1", "evaluate.latency_sentences", "-1"),
    ("evaluate.throughput_batch=0", "evaluate.throughput_batch", "0"),
    ("evaluate.teacher_beam_size=0", "evaluate.teacher_beam_size", "0"),
    ("tune.num_samples=0", "tune.num_samples", "0"),
    ("tune.grace_period=-1", "tune.grace_period", "-1"),
    ("tune.reduction_factor=1", "tune.reduction_factor", "1"),
    ("tune.max_concurrent=-1", "tune.max_concurrent", "-1"),
    ("tune.max_failures=-2", "tune.max_failures", "-2"),
    ("tune.space={loss.lambda_cc: {between: [0, 1]}}", "tune.space.loss.lambda_cc", "{'between': [0, 1]}"),
    ("tune.space={loss.lambda_cc: {choice: []}}", "tune.space.loss.lambda_cc.choice", "[]"),
    ("tune.space={loss.lambda_cc: {uniform: [1, 0]}}", "tune.space.loss.lambda_cc.uniform", "[1, 0]"),
    ("tune.space={loss.lambda_cc: {loguniform: [0, 1]}}", "tune.space.loss.lambda_cc.loguniform", "[0, 1]"),
    ("tune.space={loss.lambda_cc: {grid: [0.1], zero: 0.5}}", "tune.space.loss.lambda_cc.zero", "0.5"),
    ("tune.space={loss.lambda_cc: {loguniform: [0.1, 1], zero: 1}}", "tune.space.loss.lambda_cc.zero", "1"),
    ("tune.space={train.lr: {uniform: [0.1, .inf]}}", "tune.space.train.lr", "{'uniform': [0.1, inf]}"),
    # cross-section checks (pipeline.config.check_consistency)
    ("workdir=' '", "workdir", "' '"),
    ("teacher.model.vocab_size=128", "teacher.model.vocab_size", "128"),
    (("model.vocab_size=32", "teacher.model.vocab_size=32"), "model.vocab_size", "32"),
    (("evaluate.rerank=teacher", "evaluate.beam_size=1"), "evaluate.rerank",
     "'teacher' with model.head 'ctc' and evaluate.beam_size 1"),
    (("evaluate.rerank=self", "model.head=dag"), "evaluate.rerank", "'self' with model.head 'dag' and evaluate.beam_size 4"),
    ("evaluate.rerank=both", "evaluate.rerank", "'both'"),
    ("evaluate.rerank_weight=-0.5", "evaluate.rerank_weight", "-0.5"),
    ("evaluate.cutoff_top_n=0", "evaluate.cutoff_top_n", "0"),
    ("evaluate.cutoff_prob=0", "evaluate.cutoff_prob", "0.0"),
    ("evaluate.blank_penalties=[]", "evaluate.blank_penalties", "[]"),
    ("evaluate.blank_penalties=[0, 2, 2]", "evaluate.blank_penalties", "[0.0, 2.0, 2.0]"),
    ("evaluate.blank_penalties=[0, .inf]", "evaluate.blank_penalties[1]", "inf"),
    ("tune.space={model.upsample_ratio: {choice: [1, 2]}}", "tune.space.model.upsample_ratio", "{'choice': [1, 2]}"),
]


@pytest.mark.parametrize("overrides, key, value", FIELD_ERRORS, ids=[str(case[0]) for case in FIELD_ERRORS])
def test_every_checked_field_is_one_line_naming_its_key_and_value(overrides, key, value):
    """A bad value is reported as `<dotted.key>: <problem>, got <value>`: one line, no dataclass repr."""
    with pytest.raises(ConfigError) as error:
        load_config(SMOKE, [overrides] if isinstance(overrides, str) else list(overrides))
    message = str(error.value)
    assert re.match(rf"{re.escape(key)}: .*, got {re.escape(value)}$", message), message
    assert "Config(" not in message and "\n" not in message


def test_checks_relating_two_fields_name_both_by_their_path():
    with pytest.raises(ConfigError, match=r"^model\.n_heads: must be a positive divisor of model\.d_model \(32\), got 0$"):
        load_config(SMOKE, ["model.n_heads=0"])
    with pytest.raises(ConfigError, match=r"^teacher\.train\.average_best: must be <= teacher\.train\.keep_checkpoints "
                                          r"\(2\), got 3$"):
        load_config(SMOKE, ["teacher.train.average_best=3"])
    with pytest.raises(ConfigError, match=r"^data\.tgt_lang: must differ from data\.src_lang \('en'\), got 'en'$"):
        load_config(SMOKE, ["data.tgt_lang=en"])


def test_the_issue_26_options_load_validate_and_keep_old_configs_meaning(tmp_path):
    old = tmp_path / "old.yaml"  # a config written before fba/cc_start_step and directions existed
    old.write_text("loss:\n  lambda_fba: 0.1\n  lambda_cc: 0.1\n  aux_start_step: 168\n", encoding="utf-8")
    cfg = load_config(old)
    assert (cfg.loss.start_step("fba"), cfg.loss.start_step("cc"), cfg.loss.directions) == (168, 168, ("src2tgt", "tgt2src"))
    cfg = load_config(old, ["loss.cc_start_step=200", "loss.directions=[tgt2src]", "train.batch_tokens=max"])
    assert (cfg.loss.start_step("fba"), cfg.loss.start_step("cc"), cfg.loss.directions) == (168, 200, ("tgt2src",))
    assert cfg.train.batch_tokens == "max" and cfg.teacher.train.batch_tokens == "sum"
    for override, message in (("loss.directions=[src2tgt, en2de]", r"^loss\.directions: must be one or both of"),
                              ("loss.directions=[]", r"^loss\.directions: must be one or both of"),
                              ("loss.fba_start_step=-3", r"^loss\.fba_start_step: must be an int >= 0 or null"),
                              ("train.batch_tokens=min", r"^train\.batch_tokens: expected one of \['sum', 'max'\]")):
        with pytest.raises(ConfigError, match=message):
            load_config(None, [override])


def test_the_new_loss_keys_can_be_swept():
    cfg = load_config(None, ["tune.space={loss.fba_start_step: {choice: [0, 100]}, loss.cc_start_step: {grid: [50, null]}, "
                             "loss.directions: {choice: [[src2tgt], [tgt2src]]}, train.batch_tokens: {choice: [sum, max]}}"])
    from pipeline.stages.tune import trial_config

    trial = trial_config(cfg, {"loss.fba_start_step": 100, "loss.cc_start_step": None, "loss.directions": ["tgt2src"],
                               "train.batch_tokens": "max"})
    assert (trial.loss.start_step("fba"), trial.loss.start_step("cc"), trial.loss.directions) == (100, 0, ("tgt2src",))
    assert trial.train.batch_tokens == "max"


def _refused(tmp_path, text: str, message: str) -> None:
    """A config file of `text` is refused with an error that starts with its path and then `message` (a regex)."""
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{path}{message}"):
        load_config(path)


# A config file says what it means. Each family has several members; the message names the key (its
# whole path) and both lines, or the line of the construct.
@pytest.mark.parametrize("text, message", [
    ("workdir: a\ndata:\n  source: files\nworkdir: b\n", r":4: key 'workdir' given twice \(lines 1 and 4\)"),
    ("train:\n  lr: 0.1\nmodel:\n  d_model: 32\ntrain:\n  max_steps: 3\n", r":5: key 'train' given twice \(lines 1 and 5\)"),
    ("train:\n  lr: 0.1\n  max_steps: 2\n  lr: 0.2\n", r":4: key 'train\.lr' given twice \(lines 2 and 4\)"),
    ("teacher:\n  model:\n    d_model: 8\n    d_model: 16\n", r":4: key 'teacher\.model\.d_model' given twice \(lines 3 and 4\)"),
    ("data:\n  dedupe: true\n  dedupe: false\n", r":3: key 'data\.dedupe' given twice \(lines 2 and 3\)"),
    ("tune:\n  space:\n    loss.lambda_fba: {grid: [1]}\n    loss.lambda_fba: {grid: [2]}\n",
     r":4: key 'tune\.space\.loss\.lambda_fba' given twice \(lines 3 and 4\)"),
    ("evaluate: {splits: [test], splits: [valid]}\n", r":1: key 'evaluate\.splits' given twice \(lines 1 and 1\)"),
], ids=["top-level", "second section", "in a section", "nested section", "flow-equal values", "tune.space",
        "flow mapping"])
def test_a_key_given_twice_is_an_error_naming_the_key_and_both_lines(tmp_path, text, message):
    _refused(tmp_path, text, message + "; the second would silently replace the first")


@pytest.mark.parametrize("text, message", [
    ("data:\n  max_chars: 5\ndata.max_chars: 6\n", r":3: dotted key 'data\.max_chars' in a file; the section sets it "
                                                    r"too, at line 2: one key given twice"),
    ("data.max_chars: 6\ndata:\n  max_chars: 5\n", r":1: dotted key 'data\.max_chars' in a file; the section sets it "
                                                    r"too, at line 3"),
    ("teacher:\n  model:\n    d_model: 8\n  model.d_model: 16\n", r":4: dotted key 'teacher\.model\.d_model' in a "
                                                                    r"file; the section sets it too, at line 3"),
    ("workdir: x\ndata.max_chars: 6\n", r":2: dotted key 'data\.max_chars' in a file; dotted keys are command-line"),
], ids=["section first", "dotted first", "nested", "dotted alone"])
def test_a_dotted_key_in_a_file_is_an_error_naming_both_lines(tmp_path, text, message):
    _refused(tmp_path, text, message)


@pytest.mark.parametrize("text, message", [
    ("train: &t\n  lr: 0.1\nteacher:\n  train: *t\n", r":1: an anchor \(&t\) is not plain data"),
    ("workdir: runs/x\nmodel:\n  d_model: *size\n", r":3: an alias \(\*\) is not plain data"),
    ("train:\n  <<: {lr: 0.1}\n", r":2: a merge key \(<<\) is not plain data"),
    ("workdir: !!str 5\n", r":1: a tag \(tag:yaml\.org,2002:str\) is not plain data"),
    ("evaluate:\n  splits: !!set {test: null}\n", r":2: a tag \(tag:yaml\.org,2002:set\) is not plain data"),
    ("workdir: !custom runs\n", r":1: a tag \(!custom\) is not plain data"),
], ids=["anchor", "alias", "merge key", "str tag", "set tag", "local tag"])
def test_yaml_beyond_plain_data_is_an_error_naming_the_line(tmp_path, text, message):
    _refused(tmp_path, text, message)


def test_overrides_follow_the_same_rules_and_dotted_keys_stay_legal_where_they_name_keys():
    with pytest.raises(ConfigError, match=r"^override 'tune\.space=\{a: 1, a: 2\}':1: key 'a' given twice"):
        load_config(None, ["tune.space={a: 1, a: 2}"])
    with pytest.raises(ConfigError, match=r"^override 'workdir=!!str 5':1: a tag"):
        load_config(None, ["workdir=!!str 5"])
    cfg = load_config(None, ["tune.space={model.d_model: {choice: [16, 32]}}"])
    assert cfg.tune.space == {"model.d_model": {"choice": [16, 32]}}


def test_a_resolved_config_with_repeated_values_has_no_aliases():
    """to_yaml writes what load_config reads: a value object seen twice is written out twice, never as an alias."""
    cfg = load_config(None, ["tune.space={train.lr: {grid: [0.001]}}"])
    assert "&" not in to_yaml(cfg) and "*" not in to_yaml(cfg)


def test_docs_config_md_is_the_reference_generated_from_the_dataclasses():
    """docs/CONFIG.md cannot drift: it is `python -m pipeline.configdoc`'s output, every key of every
    section there with its default."""
    from pipeline import configdoc
    from pipeline.config import PipelineConfig

    text = configdoc.reference()
    assert (Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md").read_text(encoding="utf-8") == text, \
        "docs/CONFIG.md is stale: python -m pipeline.configdoc > docs/CONFIG.md"
    flat = configdoc._flatten(PipelineConfig().to_dict())
    for section, values in flat.items():
        if section and not section.endswith(("teacher.train", "cmlm.train")):
            for key, value in values.items():
                if not isinstance(value, dict):
                    assert f"| `{section}.{key}` |" in text, (section, key)
    assert "| `train.log_every` | int | `10` |" in text


def test_the_quick_gpu_recipe_plans_its_run_inside_its_budget():
    """configs/multi30k_quick.yaml: every training stage stopped by time, the teachers by their max_time, REDER
    by its share of the run's 9-minute budget (no max_time: what the run has left less the reserve), the
    teachers' time, as much again for REDER and the reserve inside the budget; stage two off; all of test 2016
    scored, and all of test 2017 flickr, by REDER greedy and the teachers' beam 4 alone (no CTC beam: its tuning
    and decoding are minutes outside training, for a decoder the target cannot count)."""
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "multi30k_quick.yaml")
    assert 0 < cfg.budget.max_time <= 540
    assert cfg.teacher.train.max_time and not cfg.train.max_time
    assert 2 * cfg.teacher.train.max_time + cfg.budget.reserve <= cfg.budget.max_time
    assert cfg.teacher.train.warmup_fraction > 0 and cfg.train.warmup_fraction > 0  # sized to the budget
    assert cfg.loss.lambda_fba == cfg.loss.lambda_cc == 0
    assert cfg.evaluate.splits == ("test", "test_2017_flickr") and cfg.evaluate.max_sentences == 0
    assert cfg.evaluate.beam_size == 1 and cfg.evaluate.rerank == "none"
    assert set(cfg.evaluate.test_sets) == {"test_2017_flickr"}
    for side in cfg.evaluate.test_sets["test_2017_flickr"].values():  # the files, as given by the config
        assert Path(side).is_file(), side
    assert cfg.evaluate.teacher_baseline and cfg.distill.enabled
