from pathlib import Path

import pytest

from pipeline.config import ConfigError, DataConfig, PipelineConfig, from_dict, load_config, to_yaml
from reder.config import ModelConfig
from reder.heads import head_class

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


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
    ("model.n_heads=3", "model: ModelConfig: d_model must be divisible by n_heads"),
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
        ("model:\n  dropout: high\n", r"^model\.dropout: expected float, got str 'high'$"),
        ("teacher:\n  model:\n    encoder_layers: 2.5\n", r"^teacher\.model\.encoder_layers: expected int, got float 2\.5$"),
        ("loss:\n  aux_start_step: '10'\n", r"^loss\.aux_start_step: expected int, got str '10'$"),
        ("model:\n  d_modle: 8\n", r"^model: unknown keys \['model\.d_modle'\]; known keys are \[.*'d_model'"),
        ("teacher:\n  model:\n    layers: 2\n", r"^teacher\.model: unknown keys \['teacher\.model\.layers'\]"),
    ]:
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError, match=message):
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
    assert default.loss.aux_start_step < default.train.max_steps  # stage two happens
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
    ("model.max_positions=0", r"^model: ModelConfig: max_positions must be >= 2 "),
    (("model.upsample_ratio=4", "model.max_positions=3"),
     r"^model: ModelConfig: max_positions must be >= 4 .*ctc head"),
    (("model.head=dag", "model.max_positions=15"), r"^model: ModelConfig: max_positions must be >= 16 .*dag head"),
    ("model.n_heads=0", r"^model: ModelConfig: d_model must be divisible by n_heads"),
    ("model.d_model=0", r"^model: ModelConfig: d_model must be >= 1"),
    ("model.ffn_dim=0", r"^model: ModelConfig: ffn_dim must be >= 1"),
    ("teacher.model.n_heads=0", r"^teacher\.model: TransformerConfig: d_model must be divisible by n_heads"),
    ("train.cpus_per_worker=-1", r"^train\.cpus_per_worker: must be > 0, got -1\.0$"),
    ("train.cpus_per_worker=0", r"^train\.cpus_per_worker: must be > 0, got 0\.0$"),
    ("train.gpus_per_worker=0", r"^train\.gpus_per_worker: must be > 0"),
    ("teacher.train.gpus_per_worker=-1", r"^teacher\.train\.gpus_per_worker: must be > 0"),
    ("distill.cpus_per_worker=0", r"^distill: .*cpus_per_worker > 0"),
    ("train.warmup_init_lr=-1e-7", r"^train\.warmup_init_lr: must be >= 0"),
    ("train.adam_eps=0", r"^train\.adam_eps: must be > 0"),
    ("train.weight_decay=-0.1", r"^train\.weight_decay: must be >= 0"),
    ("train.clip_norm=-1", r"^train\.clip_norm: must be >= 0"),
    ("train.adam_betas=[0.9, 1.0]", r"^train\.adam_betas: each must be in \[0, 1\)"),
    ("train.start_timeout_s=0", r"^train\.start_timeout_s: must be > 0"),
    ("train.max_failures=-2", r"^train\.max_failures: must be >= -1"),
    ("train.lr=0", r"^train: adam_betas needs two values, lr > 0"),  # the section is named once
    ("ray.num_cpus=-1", r"^ray\.num_cpus: must be >= 0, got -1$"),
    ("ray.object_store_memory_mb=-1", r"^ray\.object_store_memory_mb: must be >= 0"),
    ("evaluate.teacher_beam_size=0", r"^evaluate: teacher_beam_size must be >= 1"),
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
