"""Fixtures for the pipeline tests: one Ray instance for all of them, small corpora on disk."""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

WORDS_SRC = ("the a red blue small big dog cat man woman child ball street park runs walks jumps "
             "plays sits looks at with near under over green old young house river tree").split()
WORDS_TGT = ("der die das rot blau klein groß hund katze mann frau kind ball straße park läuft geht "
             "springt spielt sitzt schaut an mit bei unter über grün alt jung haus fluss baum").split()


# The pipeline tests' Ray instance (no GPU declared: tests/pipeline/test_gpu.py starts its own, then this one again).
# The dashboard serves the State API (the tests' actor checks), on a port the instance's processes are told of
# (cluster/connect.py's `init_local`, as a local run's: the cluster test's Ray runs beside the suite on this machine).
RAY_SESSION = {"address": "local", "num_cpus": 2, "object_store_memory": 200 * 1024 * 1024, "include_dashboard": True,
               "log_to_driver": False}


PREEMPTION_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


@pytest.fixture(scope="package")
def ray_session():
    """One local Ray instance shared by every test of this directory that needs it (2 CPUs, small object store),
    ended after its last: idle, its processes take ~0.11 CPU-s a second (docs/results/ci.md), which the tests
    after these (bench/, reder/, and the `timed` ones, which learn against a wall-clock limit with both cores)
    would otherwise pay for on the 2-core CI machine."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray

    from cluster.connect import LOCAL_ENV, init_local

    # Ray Train's preemption watcher (an actor per fit, for a cloud's spot instances) is off in a local run
    # (cluster.connect.LOCAL_ENV): off for the fits on this instance too, as the driver passes it on to each fit's
    # controller. The cluster tests' hosts and drivers, started before it or with an environment of their own, keep it.
    os.environ.setdefault(PREEMPTION_WATCHER, LOCAL_ENV[PREEMPTION_WATCHER])

    if not ray.is_initialized():
        init_local(RAY_SESSION)
    yield ray
    ray.shutdown()


SMOKE = Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml"
# The Debian Bibles the default config reads (sword-text-web, sword-text-sparv; .ci/run installs them)
SYSTEM_SWORD = Path("/usr/share/sword/mods.d")
SWORD_BIBLES = all((SYSTEM_SWORD / name).is_file() for name in ("engWEB2015eb.conf", "spaRV1909eb.conf"))
needs_sword_bibles = pytest.mark.skipif(not SWORD_BIBLES, reason="Debian packages sword-text-web and sword-text-sparv "
                                                                  "are not installed")
DATA_STAGES = ("ingest", "spm", "tokenize")


@pytest.fixture(scope="package")
def smoke_data_stages(tmp_path_factory: pytest.TempPathFactory, ray_session) -> Path:
    """The smoke config's data stages (ingest, spm, tokenize), run once for this directory's tests on their Ray
    instance: the workdir that holds them. Read-only: tests take copies (`smoke_data`)."""
    import run_pipeline

    workdir = tmp_path_factory.mktemp("smoke-data")
    assert run_pipeline.main(["--config", str(SMOKE), f"workdir={workdir}", "tracking.enabled=false",
                              "--stages", ",".join(DATA_STAGES)]) == 0
    return workdir


@pytest.fixture
def smoke_data(smoke_data_stages: Path, tmp_path: Path) -> Path:
    """`tmp_path` with a copy of the smoke config's finished data stage directories. Stage directories are named by
    the hash of what they were made from, so a run whose data, spm and model keys are the smoke config's reuses
    them (skipped, finished earlier) and any other config makes its own: a test of training need not tokenize."""
    for stage in sorted(smoke_data_stages.iterdir()):
        if stage.name.split("-")[0] in DATA_STAGES and (stage / "_SUCCESS").is_file():
            shutil.copytree(stage, tmp_path / stage.name)
    return tmp_path


def make_pairs(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """Deterministic word-salad sentence pairs of varied length (a translation-shaped toy corpus)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        length = rng.randint(3, 14)
        picks = [rng.randrange(len(WORDS_SRC)) for _ in range(length)]
        src = " ".join(WORDS_SRC[i] for i in picks).capitalize() + "."
        tgt = " ".join(WORDS_TGT[i] for i in picks).capitalize() + "."
        pairs.append((src, tgt))
    return pairs


def write_files_corpus(directory: Path, sizes: dict[str, int] | None = None, seed: int = 0,
                       langs: tuple[str, str] = ("en", "de")) -> Path:
    """`<split>.<lang>` files for train/valid/test in `directory`; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    sizes = sizes or {"train": 300, "valid": 40, "test": 40}
    for offset, (split, size) in enumerate(sizes.items()):
        pairs = make_pairs(size, seed + offset)
        for side, lang in enumerate(langs):
            (directory / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    return directory


class DecoderClock:
    """A fake clock for `pipeline.stages.evaluate` that only the evaluated decoders move, by times the test chose:
    `costs[decoder] = (single, batch)`, a call at batch size 1 costs `single` seconds per sentence, a call at a
    larger batch size `batch` seconds in all. Latencies, throughputs and speed-ups are then known numbers
    (`expected_speed`), not ones re-derived from the report under test."""

    def __init__(self, costs: dict[str, tuple[float, float]]) -> None:
        self.costs, self.now = costs, 0.0

    def __call__(self) -> float:
        return self.now

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "DecoderClock":
        """Time `pipeline.stages.evaluate` (and so bench.decode_speed) by this clock: every decoder that
        `evaluate.decoders_for` returns advances it by its cost before it decodes."""
        from pipeline.stages import evaluate

        real = evaluate.decoders_for

        def decoders_for(*args, **kwargs):
            return {name: self._costed(name, translate) for name, translate in real(*args, **kwargs).items()}

        monkeypatch.setattr(evaluate, "clock", self)
        monkeypatch.setattr(evaluate, "decoders_for", decoders_for)
        return self

    def _costed(self, name, translate):
        single, batch = self.costs[name]

        def timed(encoded, direction, batch_size):
            self.now += single * len(encoded) if batch_size == 1 else batch
            return translate(encoded, direction, batch_size)
        return timed

    def expected_speed(self, sentences: int, throughput_batch: int,
                       decoders: tuple[str, ...] | None = None) -> dict[str, float]:
        """The `speed` fields measure_speed must report for `sentences` test sentences under these costs, of
        `decoders` (default: every decoder with a cost)."""
        costs = self.costs if decoders is None else {name: self.costs[name] for name in decoders}
        expected: dict[str, float] = {}
        for name, (single, batch) in costs.items():
            expected.update({f"{name}_latency_ms": round(1000 * single, 3), f"{name}_latency_p90_ms": round(1000 * single, 3),
                             f"{name}_sentences_per_s": round(sentences / batch, 2)})
        for ours in [name for name in costs if not name.startswith("teacher_")]:
            for baseline in [name for name in costs if name.startswith("teacher_")]:
                expected[f"speedup_{ours}_vs_{baseline}_batch1"] = round(costs[baseline][0] / costs[ours][0], 2)
                expected[f"speedup_{ours}_vs_{baseline}_batch{throughput_batch}"] = round(
                    costs[baseline][1] / costs[ours][1], 2)
        return expected
