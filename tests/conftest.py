"""Shared pytest fixtures: every test starts from the same seeds; `gpu` tests skip without CUDA."""
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
import torch

from cluster.connect import TRAIN_ENV, free_port  # noqa: F401  (free_port: the tests' free loopback port, the dashboard's)

# Every Ray instance the suite starts (ray.init, ray.cluster_utils, pipeline subprocesses, the launcher of the
# cluster tests) keeps its files in a directory of this session's own, never in Ray's machine-wide /tmp/ray:
# a test must not depend on what an earlier run, another user or a root launcher left there (a /tmp/ray made
# 755 by root broke the cluster test on fresh machines only), nor join another cluster's Ray through the
# address file there (`ray.init()` with no address does). Short: Ray's socket paths live under it (107 bytes).
# A process of the session that imports this file again (a Ray worker unpickling a function of a test
# module) keeps the session's directory instead of making one that nobody removes.
SESSION_RAY_TMPDIR = "DUPLEX_TEST_RAY_TMPDIR"
OWN_RAY_TMPDIR = not os.environ.get(SESSION_RAY_TMPDIR)
RAY_TMPDIR = os.environ.get(SESSION_RAY_TMPDIR) or tempfile.mkdtemp(prefix="dpx-ray-",
                                                                    dir="/tmp" if sys.platform != "win32" else None)
os.environ["RAY_TMPDIR"] = os.environ[SESSION_RAY_TMPDIR] = RAY_TMPDIR
os.environ.pop("RAY_ADDRESS", None)
# What a run makes once per host and reuses (pipeline.tracking.store's empty MLflow store), in the session's directory:
# made by the session's first new store, as on a fresh machine.
os.environ["DUPLEX_CACHE"] = os.path.join(RAY_TMPDIR, "cache")

# Ray Train's poll of its workers as a pipeline run sets it (cluster.connect.TRAIN_ENV), for the tests that fit
# on the session's Ray instance without going through connect().
os.environ.update({key: os.environ.get(key, value) for key, value in TRAIN_ENV.items()})

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def seed_everything() -> None:
    random.seed(0)
    torch.manual_seed(0)


SESSION_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """Every test starts on the session's torch thread count. Code built to run in its own process leaks its
    count into the rest of the session when a test or a fixture calls it directly: a Ray actor's
    `torch.set_num_threads` (distill's TeacherDecoder: every test after tests/pipeline/test_distill.py ran on
    one thread, the learning tests about 1.9x slower), a CTranslate2 translator's `intra_threads`, which sets
    OpenMP's count for the whole process (tests/reder/test_ct2.py's module fixture: every later test)."""
    if torch.get_num_threads() != SESSION_THREADS:
        torch.set_num_threads(SESSION_THREADS)
    yield


REPO = Path(__file__).resolve().parents[1]
# MLflow's default artifact root, relative to the working directory (the repository, where pytest runs): an
# experiment made without an artifact location writes there
STRAY = (REPO / "mlruns", REPO / "mlartifacts")


@pytest.fixture(autouse=True)
def leaves_nothing_in_the_repository() -> Iterator[None]:
    """A test writes under its tmp_path, not into the repository: a store's default artifact root (./mlruns), made
    by the test, fails it (and is removed, so that the next test is judged on its own)."""
    before = [path.exists() for path in STRAY]
    yield
    made = [path for path, existed in zip(STRAY, before) if not existed and path.exists()]
    for path in made:
        shutil.rmtree(path, ignore_errors=True)
    assert not made, f"the test wrote into the repository: {[str(p) for p in made]}"


@pytest.fixture(autouse=True)
def no_inherited_mlflow_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI: without this, one test's store leaks into the
    next pipeline run of the same process."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


# tests/cluster/test_ray_up.py's first test starts a one-machine cluster and leaves the rest of the doc's
# commands (the pipeline runs, a sweep, `ray down`) to a background thread; its second test asserts what that
# thread saw. The first runs first (while nothing else holds the head's ports), the second after every other
# test but the `timed` ones, which learn against a wall-clock limit and so must not share the CPUs with that
# background work. Right after the first come the fault, pipeline and cluster tests, which wait on processes
# part of the time (about 70 % of 2 cores busy alone). Measured in CI runs, this order gave the same total
# time as bench/ first: the slowdown from the background work only moves. It is kept so that bench/'s timing
# tests run without that work beside them.
RAY_UP_FIRST = "test_ray_up_starts_the_head_as_the_docs_say"
RAY_UP_LAST = "test_two_hosts_train_together_and_ray_down_leaves_nothing"
BESIDE_THE_CLUSTER = ("tests/faults/", "tests/pipeline/", "tests/cluster/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def place(item: pytest.Item) -> int:
        name = getattr(item, "originalname", item.name)
        if name == RAY_UP_FIRST:
            return 0
        if name == RAY_UP_LAST:
            return 3
        if "timed" in item.keywords:
            return 4
        return 1 if item.nodeid.startswith(BESIDE_THE_CLUSTER) else 2

    items.sort(key=place)  # stable: the collection order within each group
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A REDER model directory (en<->de) with a real SentencePiece model of 29 pieces (vocabulary 30 with the
    blank); untrained. Read-only: copy it to break it."""
    import sentencepiece

    from reder import EOS_ID, PAD_ID, DuplexLoss
    from reder.checkpoint import save_model_dir
    from tests.reder.helpers import random_batch, tiny_model

    tmp_path = tmp_path_factory.mktemp("translate")
    torch.manual_seed(0)
    sentences = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song", "dogs and cats are friends"] * 20
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_prefix=str(tmp_path / "spm"),
                                             vocab_size=29, pad_id=PAD_ID, unk_id=1, bos_id=2, eos_id=EOS_ID,
                                             minloglevel=2, hard_vocab_limit=True)
    model = tiny_model(vocab_size=30)
    src, src_lengths = random_batch([5, 3], 30)
    DuplexLoss(model)(src, src_lengths, src, src_lengths, step=0)  # data-initialises the ActNorms
    return save_model_dir(tmp_path / "model", model.eval(), tmp_path / "spm.model", "en", "de")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's Ray directory goes with the session (Ray's own processes have ended by now)."""
    if OWN_RAY_TMPDIR:
        shutil.rmtree(RAY_TMPDIR, ignore_errors=True)
