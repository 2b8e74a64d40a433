"""Shared pytest fixtures: every test starts from the same seeds; `gpu` tests skip without CUDA."""
import random
from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def seed_everything() -> None:
    random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def no_inherited_mlflow_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI: without this, one test's store leaks into the
    next pipeline run of the same process."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
