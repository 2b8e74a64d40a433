"""Fixtures of the bench.quality tests: a slice of Multi30k and the tiny model overrides."""
import pytest

from bench import quality
from tests.conftest import SHARED_DATA

TINY = ["model.vocab_size=300", "model.d_model=32", "model.n_heads=2", "model.ffn_dim=64", "model.layers_per_end=1",
        "teacher.model.d_model=32", "teacher.model.n_heads=2", "teacher.model.ffn_dim=64",
        "teacher.model.encoder_layers=1", "teacher.model.decoder_layers=1",
        "evaluate.latency_sentences=3", "evaluate.throughput_batch=8"]  # timing: a few sentences, not 100


@pytest.fixture
def multi30k_slice(tmp_path):
    """The first 150 training pairs and 12 sentences of each test set and of the validation split."""
    data = tmp_path / "data"
    data.mkdir()
    for split, count in (("train", 150), *((split, 12) for split in (*quality.TESTS, quality.VALID))):
        for language in ("en", "de"):
            lines = (SHARED_DATA / "multi30k" / f"{split}.{language}").read_text(encoding="utf-8").splitlines()
            (data / f"{split}.{language}").write_text("\n".join(lines[:count]) + "\n", encoding="utf-8")
    return data
