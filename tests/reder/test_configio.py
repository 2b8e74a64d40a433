"""The one config loader (reder/configio.py): keys and types checked with their paths, round trips,
and the leniency saved files need (an int for a float, a list for a tuple)."""
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reder.config import LossConfig, ModelConfig, TransformerConfig
from reder.configio import ConfigError, from_dict, require, to_dict


@dataclass(frozen=True)
class Inner:
    ratio: float = 1.0
    betas: tuple[float, ...] = (0.9, 0.98)


@dataclass(frozen=True)
class Bounded:
    rate: float = 1.0
    workers: int = 0
    dropout: float = 0.0
    coverage: float = 1.0
    share: float = 0.5
    ratio: float = 0.5

    def __post_init__(self) -> None:
        require(self, rate="> 0", workers=">= 0", dropout="in [0, 1)", coverage="in (0.5, 1]", share="< 1",
                ratio="<= 0.5")


@dataclass(frozen=True)
class Outer:
    name: str = "x"
    inner: Inner = field(default_factory=Inner)
    model: ModelConfig = field(default_factory=ModelConfig)


def test_every_reder_config_round_trips_through_json():
    for cfg in (ModelConfig(head="dag", graph_upsample_ratio=3.5), TransformerConfig(vocab_size=20, d_model=32),
                LossConfig(lambda_fba=0.5, aux_start_step=7)):
        assert type(cfg).from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
        assert from_dict(type(cfg), to_dict(cfg)) == cfg


def test_unknown_keys_are_errors_that_name_their_path():
    with pytest.raises(ConfigError, match=r"ModelConfig: unknown keys \['d_modle'\]; known keys are \[.*'d_model'"):
        ModelConfig.from_dict({"d_modle": 3})
    with pytest.raises(ConfigError, match=r"inner: unknown keys \['inner.rate'\]"):
        from_dict(Outer, {"inner": {"rate": 2.0}})


def test_wrong_types_are_errors_that_name_their_path():
    with pytest.raises(ConfigError, match=r"^d_model: expected int, got str '512'$"):
        ModelConfig.from_dict({"d_model": "512"})
    with pytest.raises(ConfigError, match=r"^model\.dropout: expected float, got str 'high'$"):
        from_dict(Outer, {"model": {"dropout": "high"}})
    with pytest.raises(ConfigError, match=r"model\.share_ends: expected bool, got int 1"):
        from_dict(Outer, {"model": {"share_ends": 1}})
    with pytest.raises(ConfigError, match=r"inner\.betas\[1\]: expected float, got str"):
        from_dict(Outer, {"inner": {"betas": [0.9, "b"]}})
    with pytest.raises(ConfigError, match=r"inner: expected a mapping for Inner, got list"):
        from_dict(Outer, {"inner": [1]})
    with pytest.raises(ConfigError, match=r"lambda_cc: expected float, got bool"):
        LossConfig.from_dict({"lambda_cc": True})


def test_value_checks_name_the_field_and_the_fields_they_relate_to():
    with pytest.raises(ValueError, match=r"^n_heads: must be a positive divisor of d_model \(512\), got 3$"):
        ModelConfig(n_heads=3)  # built directly: a FieldError, which is a ValueError
    with pytest.raises(ConfigError, match=r"^n_heads: must be a positive divisor of d_model \(512\), got 3$"):
        ModelConfig.from_dict({"n_heads": 3})
    with pytest.raises(ConfigError, match=r"^model\.n_heads: must be a positive divisor of model\.d_model \(512\), got 3$"):
        from_dict(Outer, {"model": {"n_heads": 3}})
    with pytest.raises(ConfigError, match=r"^model\.max_positions: .* model\.upsample_ratio \(4\) .*, got 3$"):
        from_dict(Outer, {"model": {"upsample_ratio": 4, "max_positions": 3}})
    with pytest.raises(ValueError, match=r"^aux_start_step: must be >= 0, got -1$"):
        LossConfig(aux_start_step=-1)
    assert issubclass(ConfigError, ValueError)  # callers catching ValueError still do


def test_non_finite_floats_are_rejected_at_load():
    """No field means anything by inf or nan, so none loads one (json.loads reads Infinity and NaN too)."""
    with pytest.raises(ConfigError, match=r"^model\.dropout: expected a finite number, got nan$"):
        from_dict(Outer, {"model": {"dropout": float("nan")}})
    with pytest.raises(ConfigError, match=r"^inner\.betas\[0\]: expected a finite number, got -inf$"):
        from_dict(Outer, json.loads('{"inner": {"betas": [-Infinity, 0.9]}}'))
    with pytest.raises(ConfigError, match=r"^inner\.ratio: expected a finite number, got 1000"):
        from_dict(Outer, {"inner": {"ratio": 10 ** 400}})  # an int beyond float's range


def test_field_bounds_name_the_whole_key_path():
    with pytest.raises(ConfigError, match=r"^outer\.bounded\.rate: must be > 0, got 0\.0$"):
        from_dict(Bounded, {"rate": 0}, "outer.bounded")
    with pytest.raises(ValueError, match=r"^workers: must be >= 0, got -1$"):
        Bounded(workers=-1)
    assert from_dict(Bounded, {"rate": 0.5, "workers": 0}) == Bounded(0.5, 0)


@pytest.mark.parametrize("field, good, bad, rule", [
    ("dropout", (0.0, 0.99), (-0.1, 1.0), "in [0, 1)"),
    ("coverage", (0.51, 1.0), (0.5, 1.01), "in (0.5, 1]"),
    ("share", (0.99, -3.0), (1.0, 2.0), "< 1"),
    ("ratio", (0.5, -3.0), (0.51, 1.0), "<= 0.5"),
])
def test_require_compares_and_checks_both_ends_of_an_interval(field, good, bad, rule):
    for value in good:
        assert getattr(Bounded(**{field: value}), field) == value
    for value in bad:
        with pytest.raises(ValueError, match=rf"^{field}: must be {re.escape(rule)}, got {value}$"):
            Bounded(**{field: value})


def test_an_int_loads_as_a_float_and_a_list_as_a_tuple():
    cfg = ModelConfig.from_dict({"head": "dag", "graph_upsample_ratio": 8, "dropout": 0})
    assert cfg.graph_upsample_ratio == 8.0 and isinstance(cfg.graph_upsample_ratio, float)
    assert isinstance(cfg.dropout, float) and cfg == ModelConfig(head="dag", graph_upsample_ratio=8.0, dropout=0.0)
    outer = from_dict(Outer, {"inner": {"betas": [0.9, 1]}})
    assert outer.inner.betas == (0.9, 1.0) and to_dict(outer)["inner"]["betas"] == [0.9, 1.0]
    assert from_dict(Outer, None) == Outer()
    with pytest.raises(ConfigError, match=r"^vocab_size: expected int, got float 8000.0$"):
        ModelConfig.from_dict({"vocab_size": 8000.0})  # a float is never truncated to an int


def test_reder_imports_no_yaml_ray_or_mlflow():
    """reder/ (the loader included) stays pure PyTorch: importing every module pulls none of them in."""
    code = ("import pkgutil, importlib, sys, reder\n"
            "for module in pkgutil.iter_modules(reder.__path__): importlib.import_module(f'reder.{module.name}')\n"
            "print(sorted({'yaml', 'ray', 'mlflow'} & {name.split('.')[0] for name in sys.modules}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.stdout.strip() == "[]"
