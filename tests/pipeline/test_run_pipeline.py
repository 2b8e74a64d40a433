import contextlib
import gzip
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil  # noqa: F401  (a requirement: the smoke run's MLflow system metrics are sampled by it)
import pytest

import run_pipeline
from pipeline import progress
from pipeline.config import ConfigError
from pipeline.stages import evaluate
from pipeline.tracking.store import STAGE_TAG
from tests.pipeline.conftest import DecoderClock, needs_sword_bibles, write_files_corpus
from tests.pipeline.test_raytrain import wait_for_cpus

SMOKE = Path(run_pipeline.__file__).resolve().parent / "configs" / "smoke.yaml"
SMOKE_CORPUS = SMOKE.parents[1] / "tests" / "data" / "bible_en_es"  # its data.local_dir: <split>.en, <split>.es


def sacrebleu_cli(reference: Path, hypotheses: Path) -> dict[str, dict]:
    """sacreBLEU's own command line, default options (what pipeline.metrics uses), on a hypothesis file and a
    reference file: {metric name: its JSON entry (score to 10 decimals, signature)} for BLEU and chrF."""
    out = subprocess.run([sys.executable, "-m", "sacrebleu", str(reference), "-i", str(hypotheses), "-m", "bleu", "chrf",
                          "-w", "10"], capture_output=True, text=True, check=True)
    return {entry["name"]: entry for entry in json.loads(out.stdout)}


def assert_results_are_sacrebleu_clis(results: dict, evaluate_dir: Path, sentences: int, tmp: Path) -> None:
    """Every BLEU and chrF in the evaluate stage's results.json (each split, direction and decoder, the teachers'
    rows, both round trips, the headline) is what sacreBLEU's command line gives for the hypothesis file the stage
    wrote against the original references: the first `sentences` lines of the smoke corpus's files as shipped
    (not the ingested Parquet, not anything evaluate wrote)."""
    tmp.mkdir()
    for path in SMOKE_CORPUS.glob("*.e[ns]"):  # <split>.<lang>, cut to the lines evaluate scored
        lines = path.read_text(encoding="utf-8").splitlines()[:sentences]
        (tmp / path.name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    language = {"src": "en", "tgt": "es"}
    roundtrips = {f"{key.split('.')[0]}.roundtrip_{key.split('.')[1]}.greedy": key for key in results["roundtrip"]}
    assert {path.stem for path in evaluate_dir.glob("*.txt")} == set(results["scores"]) | set(roundtrips)
    # 2 splits x 2 directions x the decoders (4, or 5 with greedy_unpenalised: the caller checks which); 2 x 2
    assert len(results["scores"]) in (16, 20) and len(roundtrips) == 4
    cli = {}
    for key, entry in results["scores"].items():
        split, direction, _ = key.split(".")
        cli[key] = sacrebleu_cli(tmp / f"{split}.{language['tgt' if direction == 'src2tgt' else 'src']}",
                                 evaluate_dir / f"{key}.txt")
        assert (round(entry["bleu"], 10), round(entry["chrf"], 10), entry["sentences"]) == \
            (cli[key]["BLEU"]["score"], cli[key]["chrF2"]["score"], sentences), key
        assert (cli[key]["BLEU"]["signature"], cli[key]["chrF2"]["signature"]) == \
            (results["bleu_signature"], results["chrf_signature"]), key
    for name, key in roundtrips.items():  # x -> y^ -> x^, scored against x
        split, side = key.split(".")
        cli[key] = sacrebleu_cli(tmp / f"{split}.{language[side]}", evaluate_dir / f"{name}.txt")
        assert round(results["roundtrip"][key], 10) == cli[key]["BLEU"]["score"], key
    headline = {"bleu_src2tgt": cli["test.src2tgt.greedy"]["BLEU"], "bleu_tgt2src": cli["test.tgt2src.greedy"]["BLEU"],
                "chrf_src2tgt": cli["test.src2tgt.greedy"]["chrF2"], "chrf_tgt2src": cli["test.tgt2src.greedy"]["chrF2"],
                "roundtrip_bleu_src": cli["test.src"]["BLEU"], "roundtrip_bleu_tgt": cli["test.tgt"]["BLEU"]}
    assert {name: round(results[name], 10) for name in headline} == {name: e["score"] for name, e in headline.items()}


def by_stage(runs: list) -> dict:
    """MLflow runs by what they are (tag duplex.stage: "pipeline", a stage, "teacher src2tgt", ...)."""
    return {run.data.tags[STAGE_TAG]: run for run in runs}


def test_unknown_stage_and_bad_key_fail_fast(tmp_path, capsys):
    assert run_pipeline.main(["--config", str(SMOKE), f"workdir={tmp_path}", "--stages", "ingest,train2"]) == 2
    assert "unknown stage(s) ['train2']" in capsys.readouterr().err
    assert run_pipeline.main(["--config", str(SMOKE), f"workdir={tmp_path}", "data.sauce=files"]) == 2
    assert "data.sauce" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        run_pipeline.select_stages(",")
    assert run_pipeline.select_stages("tokenize,ingest") == ["ingest", "tokenize"]  # always in run order


def test_default_run_without_the_sword_packages_says_what_to_install(tmp_path, capsys):
    code = run_pipeline.main([f"workdir={tmp_path}", f"data.sword_path={tmp_path / 'no-sword'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "apt-get install -y sword-text-web sword-text-sparv" in err
    assert not list(tmp_path.glob("ingest-*"))  # nothing published
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")  # the failure is on record in MLflow
    runs = by_stage(mlflow.search_runs(experiment_names=["duplex"], output_format="list"))
    assert set(runs) == {"pipeline", "ingest"}
    assert runs["ingest"].info.run_name.startswith("default-ingest-")  # <config>-<stage directory>
    assert {r.info.status for r in runs.values()} == {"FAILED"}
    assert "apt-get install" in runs["ingest"].data.tags["error"] and "error" in runs["pipeline"].data.tags



# Every line the default run's data stages may print, and nothing else: a new line, a warning or a traceback fails
LOG = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+INFO "
TRUE_LINES = [rf"\[[1-3]/3\] (ingest|spm|tokenize): running -> {{w}}/\1-[0-9a-f]{{12}}",
              rf"{LOG}pipeline\.stages\.ingest\.stage: ingest reads SWORD modules engWEB2015eb and spaRV1909eb from "
              rf"/usr/share/sword \(\d+ files\)",
              rf"{LOG}pipeline\.stage: (ingest|spm|tokenize): finished in [\d.]+ s \({{w}}/\1-[0-9a-f]{{12}}\)",
              rf"{LOG}worker\.py:\d+ -- Started a local Ray instance\. View the dashboard at .*http://127\.0\.0\.1:\d+ .*",
              rf"{LOG}cluster\.connect: ray: 2\.0 CPUs available",
              rf"{LOG}pipeline\.stages\.tokenize: tokenize: \d+ staged files of \d+ rows at most",
              rf"{LOG}pipeline\.stages\.tokenize: tokenize: 1 workers, [\d.]+ s on Ray",
              r"", r"summary", rf"  (ingest|spm|tokenize) +ran +[\d.]+ s  {{w}}/\1-[0-9a-f]{{12}}",
              r"      (train|valid|test) +kept +\d+ of +\d+   (dropped|flagged \(kept\)): \{.*\}",
              r"      vocab_size 8000 \(blank id 7999\)", rf"  workdir {{w}}   mlflow: sqlite:///{{w}}/mlflow\.db",
              rf"  browse: mlflow ui --backend-store-uri sqlite:///{{w}}/mlflow\.db   then http://127\.0\.0\.1:5000/#/.*"]
# Not the product's and not Ray's: Abseil (a C++ library bundled in Ray's, pyarrow's and sentencepiece's binaries)
# prints a mutex's debug event, "[mutex.cc : 452] RAW: Lock blocking 0x...", and its stack's frames when it finds
# that mutex's event bit set (memory no longer a live mutex's), and Ray forwards the worker's stderr. Seen once, in
# the CI run of 2026-12-01 (a Parquet sampling task of tokenize, the stage finished): a user may see it too.
# Allowed only as that: the event line, then frame lines from the same worker.
WORKER = r"\x1b\[36m\(.+? pid=(\d+)\)\x1b\[0m "
ABSEIL_EVENT = re.compile(rf"{WORKER}\[mutex\.cc : \d+\] RAW: .*")
ABSEIL_FRAME = re.compile(rf"{WORKER}\s*@\s+0x[0-9a-f]+\b.*")


def abseil_mutex_events(lines: list[str]) -> set[int]:
    """Indices of `lines` that are Abseil's mutex debug events from a Ray worker: the event line and the stack
    frame lines that worker printed after it."""
    found, pids = set(), set()
    for index, line in enumerate(lines):
        event, frame = ABSEIL_EVENT.fullmatch(line), ABSEIL_FRAME.fullmatch(line)
        if event:
            pids.add(event.group(1))
        if event or (frame and frame.group(1) in pids):
            found.add(index)
    return found


def test_only_abseil_s_event_and_its_frames_pass_as_a_worker_s_third_party_lines():
    worker = "\x1b[36m(_fetch_parquet_file_info pid=30461)\x1b[0m "
    other = "\x1b[36m(Tokenizer pid=30462)\x1b[0m "
    lines = [worker + "    @     0x561c98593f40  (unknown)  (unknown)",  # a frame before any event
             worker + "[mutex.cc : 452] RAW: Lock blocking 0x561c9861dcb0   @ 0x7fa33640 0x561c98593f40",
             worker + "    @     0x561c98593f40  (unknown)  (unknown)",
             other + "    @     0x561c98593f40  (unknown)  (unknown)",  # another worker's frame
             worker + "Traceback (most recent call last):",
             "[mutex.cc : 452] RAW: Lock blocking 0x561c9861dcb0"]  # not from a worker
    assert abseil_mutex_events(lines) == {1, 2}


@pytest.mark.slow
@needs_sword_bibles
def test_the_default_run_s_terminal_says_only_what_is_true(tmp_path):
    """The README's main command as a user runs it (the default config, tracking on; its data stages, the ones
    before training: ingest, spm and tokenize), its terminal read line by line: each line is one of the lines
    this stage prints and nothing else — Ray Data's "The Ray cluster currently does not have any available CPUs.
    The Dataset job will hang" at tokenize, once printed in every default run though the job finished in
    seconds, any warning, a traceback or a new line fail it. Abseil's mutex debug event from a Ray worker
    (above) is told apart as a third party's line."""
    workdir = tmp_path / "default"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run([sys.executable, "run_pipeline.py", f"workdir={workdir}", "--stages", "ingest,spm,tokenize"],
                          cwd=SMOKE.parents[1], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (done.stdout + done.stderr).splitlines()
    patterns = [re.compile(line.replace("{w}", re.escape(str(workdir)))) for line in TRUE_LINES]
    third_party = abseil_mutex_events(lines)
    untrue = [line for i, line in enumerate(lines)
              if i not in third_party and not any(p.fullmatch(line) for p in patterns)]
    assert not untrue, untrue
    assert sum(" finished in " in line for line in lines) == 3 and "  tokenize  " in done.stdout

def test_later_stage_alone_needs_earlier_ones(tmp_path, capsys):
    assert run_pipeline.main(["--config", str(SMOKE), f"workdir={tmp_path}", "--stages", "spm"]) == 2
    assert "stage 'ingest' has no finished output" in capsys.readouterr().err


def test_bad_input_is_one_error_line_and_exit_code_2(tmp_path, capsys):
    """A YAML syntax error, a non-finite value and a corrupt corpus reach the user as
    `error: <message>` naming the file or key, with no traceback."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  lr: [0.1\n", encoding="utf-8")
    gz = tmp_path / "corpus"
    write_files_corpus(gz)
    packed = gzip.compress((gz / "train.de").read_bytes())
    (gz / "train.de").unlink()
    (gz / "train.de.gz").write_bytes(packed[:10] + b"\xff" * 20 + packed[30:])  # zlib.error when inflated
    corpus = ["data.source=files", f"data.local_dir={gz}", "data.src_lang=en", "data.tgt_lang=de"]
    for argv, message in [
        (["--config", str(bad)], rf"{bad}:3:1: invalid YAML \(.*\); fix the YAML syntax"),
        (["--config", str(SMOKE), "train.lr=.inf"], r"train\.lr: expected a finite number, got inf"),
        (["--config", str(SMOKE), "train.cpus_per_worker=0"], r"train\.cpus_per_worker: must be > 0, got 0\.0"),
        (["--config", str(SMOKE), "model.n_heads=0"], r"model\.n_heads: must be a positive divisor of model\.d_model "
                                                       r"\(32\), got 0"),
        (["--config", str(SMOKE), *corpus, "tracking.enabled=false", "--stages", "ingest"],
         rf"{gz / 'train.de.gz'}:1: corrupt gzip file \(Error -3 .*\), after 0 complete lines"),
    ]:
        assert run_pipeline.main([*argv, f"workdir={tmp_path / 'work'}"]) == 2
        out = capsys.readouterr()
        assert re.search(rf"^error: {message}[^\n]*\n\Z", out.err, re.MULTILINE), out.err  # the last line
        assert "Traceback" not in out.out + out.err
    assert not list((tmp_path / "work").glob("ingest-*"))


def test_ctrl_c_that_a_library_turned_into_its_own_error_is_still_an_interruption(capsys, monkeypatch):
    """A Ctrl-C landing inside an extension module's import surfaces as pybind11's `ImportError: initialization
    failed`, raised from the KeyboardInterrupt (a fault run saw it while distill imported CTranslate2): the run
    ends as interrupted (exit 130, one `error:` line), not with a traceback and exit 1. An error no signal is
    behind still propagates."""
    import gc
    import os
    import signal

    monkeypatch.setattr(gc, "freeze", lambda: None)  # `interrupted` freezes the exiting process's heap
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def work():
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the handler `guarded` installed raises in this frame
            time.sleep(5)
        except KeyboardInterrupt as error:
            raise ImportError("initialization failed") from error
        raise AssertionError("the signal did not arrive")

    def failing():
        raise ImportError("a real one")

    try:
        assert run_pipeline.guarded(work) == (130, (None, None))
        assert capsys.readouterr().err.splitlines()[-1].startswith("error: interrupted by Ctrl-C; ")
        with pytest.raises(ImportError, match="a real one"):
            run_pipeline.guarded(failing)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_a_training_stage_the_cluster_cannot_hold_fails_before_the_first_ray_stage_naming_its_keys(tmp_path, capsys,
                                                                                                   ray_session):
    """The teacher stage's worker group is checked before the first stage that uses Ray (tokenize, on a
    local run; on a cluster before ingest), and the error names the keys of the stage that cannot be placed
    (teacher.train.*), not the train section's."""
    argv = ["--config", str(SMOKE), f"workdir={tmp_path}", "tracking.enabled=false", "distill.enabled=true",
            "teacher.train.use_gpu=true", "teacher.train.num_workers=64", "teacher.train.start_timeout_s=0.1"]
    assert run_pipeline.main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(r"^error: teacher\.train: the cluster cannot hold 64 worker\(s\) \(.*GPU: need 64, cluster has "
                     r"\d+\); lower teacher\.train\.num_workers / teacher\.train\.cpus_per_worker, or set "
                     r"teacher\.train\.use_gpu=false, or add nodes$", err, re.MULTILINE), err
    assert list(tmp_path.glob("spm-*")) and not list(tmp_path.glob("tokenize-*"))  # checked before the first Ray stage


@dataclass(frozen=True)
class SmokeRun:
    """The smoke config's run, made once for this module (`smoke_run`): its workdir, arguments, the terminal's
    two streams as the file descriptors got them, last_run.json and the fake clock its evaluate stage timed by."""

    workdir: Path
    args: list[str]
    out: str
    err: str
    last: dict
    clock: DecoderClock

    def stage_dir(self, stage: str) -> Path:
        return Path(self.last["stages"][stage]["output"])

    def results(self) -> dict:
        return json.loads((self.stage_dir("evaluate") / "results.json").read_text())

    def hypotheses(self, name: str = "test.src2tgt.greedy") -> list[str]:
        return (self.stage_dir("evaluate") / f"{name}.txt").read_text(encoding="utf-8").splitlines()


@contextlib.contextmanager
def terminal_captured(directory: Path) -> Iterator[dict[str, Path]]:
    """What a terminal would show while inside, as files: file descriptors 1 and 2 (Ray's C++ core writes to
    them) and sys.stdout / sys.stderr (pytest's capture has them elsewhere), both appending to the same two
    files; restored after."""
    files = {"out": directory / "stdout.txt", "err": directory / "stderr.txt"}
    sys.stdout.flush(), sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with contextlib.ExitStack() as stack:
        texts = {}
        for fd, name in ((1, "out"), (2, "err")):
            raw = stack.enter_context(open(files[name], "ab"))  # O_APPEND: both writers add at the end
            os.dup2(raw.fileno(), fd)
            texts[name] = stack.enter_context(open(files[name], "a", encoding="utf-8", buffering=1))
        try:
            with contextlib.redirect_stdout(texts["out"]), contextlib.redirect_stderr(texts["err"]):
                yield files
        finally:
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, ray_session) -> SmokeRun:
    """All seven stages of the smoke config through Ray (AR teachers on Ray Train, KD on Ray Data with the default
    engine, REDER with 2 training workers and gloo DDP on the distilled pairs), tracked in MLflow, evaluate's
    decoders timed by a fake clock; run once, read by the tests below."""
    base = tmp_path_factory.mktemp("smoke-run")
    workdir = base / "work"
    args = ["--config", str(SMOKE), f"workdir={workdir}", "evaluate.measure_speed=true"]
    # evaluate's timings by a fake clock: (seconds per sentence at batch 1, seconds of a larger batch's call)
    clock = DecoderClock({"greedy": (0.002, 0.05), "beam4": (0.005, 0.1), "greedy_unpenalised": (0.002, 0.05),
                          "teacher_greedy": (0.01, 0.25), "teacher_beam4": (0.04, 0.5)})
    # As on a fresh instance: every CPU free (an earlier test's actors and groups go asynchronously), and Ray Data's
    # once-per-process "no available CPUs" warning able to fire again (an earlier test may have spent it)
    from ray.util.debug import reset_log_once

    wait_for_cpus(ray_session.cluster_resources()["CPU"], timeout_s=60.0)
    reset_log_once("cpu_warning")
    with pytest.MonkeyPatch.context() as patch, terminal_captured(base) as files:
        clock.install(patch)
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)  # an earlier test's store (module fixtures come first)
        patch.setattr(progress, "LINE_EVERY_S", 0.0)  # a progress line per report: the run is under a minute a stage
        code = run_pipeline.main(args)
    out, err = (files[name].read_text(encoding="utf-8", errors="replace") for name in ("out", "err"))
    assert code == 0, err[-5000:]
    last = json.loads((workdir / "last_run.json").read_text())
    return SmokeRun(workdir, args, out, err, last, clock)


@pytest.mark.slow
def test_the_smoke_run_runs_every_stage_and_its_terminal_says_what_is_true(smoke_run):
    """Every stage ran, on what it should (the teachers' 20 steps, REDER's 30 on the distilled pairs); the terminal
    has a progress line per stage, the summary's `mlflow ui` command, and none of the lines nobody could act on."""
    out, err, last, workdir = smoke_run.out, smoke_run.err, smoke_run.last, smoke_run.workdir
    assert "[7/7] evaluate: running" in out and "vocab_size 256 (blank id 255)" in out
    # The two Ray lines nobody could act on are gone (Ray's C++ core writes to the descriptor)
    assert "has constructor arguments in the object store" not in err
    assert "does not have any available CPUs" not in err
    assert "Skip logging GPU metrics" not in err  # MLflow's system metrics monitor, quiet
    # The summary says how to see the runs: `mlflow ui` on the store, the runs table in the view "Test BLEU"
    assert re.search(rf"browse: mlflow ui --backend-store-uri sqlite:///{re.escape(str(workdir.resolve()))}/mlflow.db   "
                     r"then http://127\.0\.0\.1:5000/#/experiments/\d+/runs\?viewStateShareKey=duplex-test-bleu&", out)
    # Progress lines off a terminal (stderr is a file here, as a log file is)
    rows = last["stages"]["distill"]["counts"]["rows"]
    terms = "".join(rf"(?=[^)]*\b{term} [\d.]+)" for term in ("ctc_src2tgt", "ctc_tgt2src", "fba_src2tgt", "cc_tgt2src"))
    lines = [line for line in re.split(r"[\r\n]", err) if line.startswith(("train", "teacher", "distill", "evaluate"))]
    for pattern in (rf"train: 30/30 steps \(100%\), [\d.]+ steps/s, elapsed \d+:\d\d, ETA 0:00; loss [\d.]+ "
                    rf"\({terms}[^)]*\), [\d,]+ tokens/s, valid BLEU src2tgt [\d.]+, tgt2src [\d.]+",
                    r"train: (5|10|15|20|25)/30 steps \(\d+%\), .*, ETA \d+:\d\d; loss [\d.]+ \(.*ctc_src2tgt.*",  # one before the end
                    # both teachers in one run: one bar
                    r"teacher: 20/20 steps \(100%\), .*; loss [\d.]+ \(nll_src2tgt [\d.]+, nll_tgt2src [\d.]+\), [\d,]+ "
                    r"tokens/s, valid BLEU src2tgt [\d.]+, tgt2src [\d.]+",
                    rf"distill: {2 * rows}/{2 * rows} sentences \(100%\), [\d.]+ sentences/s, elapsed \d+:\d\d, ETA 0:00",
                    r"evaluate: (\d+)/\1 decodes \(100%\), .*; last valid tgt2src teacher_beam4: BLEU [\d.]+"):
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, lines)
    assert [entry["status"] for entry in last["stages"].values()] == ["ran"] * 7
    teacher_counts, distill_counts = last["stages"]["teacher"]["counts"], last["stages"]["distill"]["counts"]
    assert teacher_counts["src2tgt"]["steps"] == teacher_counts["tgt2src"]["steps"] == 20
    assert distill_counts["rows"] == last["stages"]["tokenize"]["counts"]["train"]["kept"]
    # distill.engine auto: CTranslate2 where the extra is installed (CI installs it: .ci/run), else our search
    assert distill_counts["engine"] == ("ctranslate2" if importlib.util.find_spec("ctranslate2") else "torch")
    for direction in ("src2tgt", "tgt2src"):
        assert 0 <= distill_counts[f"fallback_{direction}"] <= distill_counts["rows"]
        assert distill_counts[f"length_ratio_{direction}"] > 0 and f"teacher_bleu_{direction}" in distill_counts
    train_manifest = json.loads((smoke_run.stage_dir("train") / "manifest.json").read_text())
    assert train_manifest["inputs"]["data"] == last["stages"]["distill"]["output"]  # trained on the KD pairs
    assert last["stages"]["tokenize"]["counts"]["train"]["kept"] > 350
    assert last["stages"]["train"]["counts"]["steps"] == 30


@pytest.mark.slow
def test_every_score_of_the_smoke_run_is_sacrebleus_and_every_speedup_the_clocks(smoke_run, tmp_path):
    """Every score in results.json is sacreBLEU's command line on the hypothesis files; every speed-up the one the
    (fake) clock's times give."""
    results, last = smoke_run.results(), smoke_run.last
    for key in ("bleu_src2tgt", "bleu_tgt2src", "chrf_src2tgt", "chrf_tgt2src", "roundtrip_bleu_src",
                "roundtrip_bleu_tgt"):
        assert math.isfinite(results[key]), key
    assert results["chrf_src2tgt"] > 5 and results["chrf_tgt2src"] > 5  # 30 steps learn some characters
    assert results["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert results["mlflow_run_id"] == last["mlflow_run_id"]
    # With a blank penalty tuned to other than 0 (on 30 updates' validation: either can happen), the
    # unpenalised greedy output is scored and timed beside
    decoders = smoke_decoders(results)
    assert set(results["scores"]) == {f"{split}.{d}.{decoder}" for split in ("test", "valid")
                                      for d in ("src2tgt", "tgt2src") for decoder in decoders}
    assert f"evaluate: {4 * len(decoders)}/{4 * len(decoders)} decodes (100%)" in smoke_run.err
    expected = smoke_run.clock.expected_speed(50, 16, decoders)
    assert {name: results["speed"][name] for name in expected} == expected
    assert results["speed"]["speedup_greedy_vs_teacher_beam4_batch1"] == 20.0
    assert results["speed"]["speedup_beam4_vs_teacher_greedy_batch16"] == 2.5
    assert_results_are_sacrebleu_clis(results, smoke_run.stage_dir("evaluate"), 50, tmp_path / "references")
    assert len(smoke_run.hypotheses()) == 50


def smoke_decoders(results: dict) -> tuple[str, ...]:
    penalised = any(results["blank_penalty"].values())
    return ("greedy", "beam4", *(("greedy_unpenalised",) if penalised else ()), "teacher_greedy", "teacher_beam4")


@pytest.mark.slow
def test_the_smoke_run_s_mlflow_runs_hold_its_params_metrics_artifacts_and_datasets(smoke_run):
    """The pipeline run and a nested run per stage (and per teacher), named by their directories, FINISHED, with
    the config as params, test and validation metrics by name, per-step training metrics, the artifacts, the
    translations tables, the datasets each training run read and the system metrics."""
    import mlflow
    from mlflow.tracking import MlflowClient

    last, workdir, results = smoke_run.last, smoke_run.workdir, smoke_run.results()
    uri = f"sqlite:///{workdir}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    runs = mlflow.search_runs(experiment_names=["duplex"], output_format="list")
    by_name = by_stage(runs)
    stages = ("ingest", "spm", "tokenize", "teacher", "distill", "train", "evaluate")
    assert set(by_name) == {"pipeline", *stages, "teacher src2tgt", "teacher tgt2src"}
    parent = by_name["pipeline"]
    assert parent.info.run_name == "smoke-pipeline-" + last["stages"]["evaluate"]["output"].rsplit("-", 1)[1]
    for stage in stages:  # named <config>-<stage directory>
        assert by_name[stage].info.run_name == "smoke-" + Path(last["stages"][stage]["output"]).name
    assert parent.info.run_id == last["mlflow_run_id"] and parent.info.status == "FINISHED"
    for stage in stages:
        assert by_name[stage].data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert by_name[stage].info.status == "FINISHED"
    for direction in ("src2tgt", "tgt2src"):  # each teacher: a run under the teacher stage's, BLEU and NLL
        teacher_run = by_name[f"teacher {direction}"]
        assert teacher_run.data.tags["mlflow.parentRunId"] == by_name["teacher"].info.run_id
        assert teacher_run.info.status == "FINISHED"
        assert [m.step for m in client.get_metric_history(teacher_run.info.run_id, f"valid_nll_{direction}")] == [10, 20]
        assert [m.step for m in client.get_metric_history(teacher_run.info.run_id, f"valid_bleu_{direction}")] == [10, 20]
        assert len(client.get_metric_history(teacher_run.info.run_id, f"train_nll_{direction}")) == 4
        assert len(client.get_metric_history(teacher_run.info.run_id, f"grad_norm_{direction}")) == 4
    # the pair's own metrics (one run trains both teachers) on the teacher stage's run
    assert [m.step for m in client.get_metric_history(by_name["teacher"].info.run_id, "valid_bleu")] == [10, 20]
    assert "teacher_bleu_src2tgt" in by_name["distill"].data.metrics
    for run in (parent, by_name["evaluate"]):  # test BLEU is test_*, validation BLEU valid_* (train, teachers)
        # in MLflow as reported, two decimals; exact in results.json
        assert run.data.metrics["test_bleu_src2tgt"] == round(results["bleu_src2tgt"], 2)
        assert run.data.metrics["test_chrf_tgt2src"] == round(results["chrf_tgt2src"], 2)
        assert not [name for name in run.data.metrics if name.startswith("bleu_")]
    assert parent.data.params["model.vocab_size"] == "256" and parent.data.params["train.num_workers"] == "2"
    assert parent.data.tags["bleu_signature"] == results["bleu_signature"]
    assert by_name["ingest"].data.metrics["train.kept"] == 400

    def artifacts(stage: str, path: str = "") -> set[str]:
        return {a.path for a in client.list_artifacts(by_name[stage].info.run_id, path)}

    assert "config.yaml" in artifacts("pipeline")
    assert "spm.model" in artifacts("spm")
    assert {"training.png", "history.json"} <= artifacts("train")
    assert {"results.json", "test.src2tgt.greedy.txt", "test.tgt2src.beam4.txt"} <= artifacts("evaluate")
    # a translations table per scored set, an MLflow table (sortable in the UI)
    assert artifacts("evaluate", "translations") == {"translations/test.json", "translations/valid.json"}
    table = mlflow.load_table("translations/test.json", run_ids=[by_name["evaluate"].info.run_id])
    assert len(table) == 50 and table["hypothesis_src2tgt"].tolist() == smoke_run.hypotheses()
    train_run = by_name["train"].info.run_id
    per_step = client.get_metric_history(train_run, "train_total")
    assert [m.step for m in per_step] == [5, 10, 15, 20, 25, 30]  # logged by rank 0 every log_every steps
    for name in ("train_ctc_src2tgt", "train_ctc_tgt2src", "lr", "tokens_per_s", "grad_norm"):
        assert len(client.get_metric_history(train_run, name)) == 6, name
    for name in ("train_fba_src2tgt", "train_cc_tgt2src"):  # on from update 21 (aux_start_step 20): windows 25, 30
        assert [m.step for m in client.get_metric_history(train_run, name)] == [25, 30], name
    assert [m.step for m in client.get_metric_history(train_run, "valid_bleu_src2tgt")] == [10, 20, 30]

    # what each training run read, as MLflow datasets: REDER the distilled pairs, the teachers the raw ones
    def datasets(stage: str) -> dict[str, str]:
        return {i.dataset.name: {t.key: t.value for t in i.tags}["mlflow.data.context"]
                for i in by_name[stage].inputs.dataset_inputs}

    assert datasets("train") == {"files-en-es-train-distilled": "training", "files-en-es-valid": "validation"}
    assert datasets("teacher") == {"files-en-es-train-raw": "training", "files-en-es-valid": "validation"}
    for stage in ("teacher", "train"):  # MLflow's system metrics, sampled on the node by psutil
        assert "system/node_0/cpu_utilization_percentage" in by_name[stage].data.metrics, stage
    assert not [name for name in by_name["train"].data.metrics if name.startswith("bleu_")]

    # each checkpoint a training run kept: a LoggedModel by reference (the directory Ray Train keeps), its step, its
    # validation scores linked to it and to the validation dataset (the runs' histories above keep one point a
    # validation); `search_logged_models` ranks them; the registered version is the averaged model's own LoggedModel
    kept = mlflow.search_logged_models(experiment_ids=[parent.info.experiment_id], filter_string="model_type = 'checkpoint'",
                                       order_by=[{"field_name": "metrics.valid_bleu", "ascending": False}], output_format="list")
    steps = {stage: sorted(int(m.params["step"]) for m in kept if m.source_run_id == by_name[stage].info.run_id)
             for stage in ("teacher", "train")}
    assert steps == {"teacher": [10, 20], "train": [10, 20, 30]}  # keep_checkpoints 2 and 3
    for model in kept:
        assert (Path(model.params["checkpoint"]) / "model.pt").is_file()
        linked = {m.key: m for m in model.metrics}
        assert {"valid_bleu", "valid_bleu_src2tgt", "valid_bleu_tgt2src"} <= set(linked), model.name
        assert {(m.step, m.dataset_name) for m in linked.values()} == {(int(model.params["step"]), "files-en-es-valid")}
    ranked = [next(x.value for x in m.metrics if x.key == "valid_bleu") for m in kept]
    assert ranked == sorted(ranked, reverse=True)  # best first
    train_points = {m.step: m.value for m in client.get_metric_history(train_run, "valid_bleu")}
    for model in (m for m in kept if m.source_run_id == train_run):
        assert next(x.value for x in model.metrics if x.key == "valid_bleu") == train_points[int(model.params["step"])]
    source = client.get_model_version("reder-en-es", "1").source
    assert mlflow.get_logged_model(source.removeprefix("models:/")).source_run_id == train_run
    assert source.removeprefix("models:/") not in {m.model_id for m in kept}


@pytest.mark.slow
def test_the_registered_pyfunc_and_the_translate_cli_give_evaluate_s_translations(smoke_run):
    """The published model is registered as a pyfunc that translates both ways (the first evaluated version takes
    the alias @champion); it and `python -m reder.translate` reproduce the evaluate stage's hypotheses, REDER's
    and the teacher's; duplex-compare reads the run back from MLflow."""
    import mlflow
    import pandas as pd
    from mlflow.tracking import MlflowClient

    import reder

    last, workdir = smoke_run.last, smoke_run.workdir
    uri = f"sqlite:///{workdir}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    by_name = by_stage(mlflow.search_runs(experiment_names=["duplex"], output_format="list"))
    hypotheses = smoke_run.hypotheses()
    assert by_name["train"].data.tags["model_uri"] == "models:/reder-en-es/1"
    # the first evaluated version takes the alias @champion
    assert str(client.get_model_version_by_alias("reder-en-es", "champion").version) == "1"
    assert "registry: models:/reder-en-es@champion moved to version 1: mean test BLEU" in smoke_run.out
    translator = mlflow.pyfunc.load_model("models:/reder-en-es/1")
    test_src, test_tgt = evaluate.read_text_split(smoke_run.stage_dir("ingest"), "test", 50)
    rows = [{"text": text, "src": "en", "tgt": "es"} for text in test_src[:5]] + [{"text": test_tgt[0], "src": "es", "tgt": "en"}]
    served = translator.predict(pd.DataFrame(rows))
    assert served[:5] == hypotheses[:5]
    assert served[5] == smoke_run.hypotheses("test.tgt2src.greedy")[0]
    # with params scores: each row's record, the Python API's round-trip confidence, both directions in one request
    scored = translator.predict(pd.DataFrame(rows), params={"scores": True})
    model = reder.load(smoke_run.stage_dir("train") / "model")
    assert scored[:5] == model.translate(test_src[:5], "en", "es", scores=True)
    assert scored[5] == model.translate(test_tgt[0], "es", "en", scores=True)
    assert [entry["translation"] for entry in scored] == served
    with pytest.raises(mlflow.exceptions.MlflowException, match="row 0: this model translates en->es and es->en, not en->fr"):
        translator.predict(pd.DataFrame([{"text": "Hello.", "src": "en", "tgt": "fr"}]))

    translated = subprocess.run([sys.executable, "-m", "reder.translate", "--checkpoint",
                                 str(smoke_run.stage_dir("train") / "model"), "--direction", "src2tgt"],
                                input="".join(s + "\n" for s in test_src), capture_output=True, text=True, check=True,
                                cwd=Path(run_pipeline.__file__).parent)
    assert translated.stdout.splitlines() == hypotheses
    teacher_dir = smoke_run.stage_dir("teacher") / "tgt2src" / "model"
    translated = subprocess.run([sys.executable, "-m", "reder.translate", "--checkpoint", str(teacher_dir),
                                 "--direction", "tgt2src", "--beam", "4"], input="".join(s + "\n" for s in test_tgt),
                                capture_output=True, text=True, check=True, cwd=Path(run_pipeline.__file__).parent)
    assert translated.stdout.splitlines() == smoke_run.hypotheses("test.tgt2src.teacher_beam4")


@pytest.mark.slow
def test_duplex_compare_reads_the_smoke_run_back_from_mlflow(smoke_run, capsys):
    """duplex-compare on the run's hypotheses and tables from MLflow (a run against itself: no difference on any
    line)."""
    from pipeline import compare

    uri = f"sqlite:///{smoke_run.workdir}/mlflow.db"
    run_id = smoke_run.last["mlflow_run_id"]
    assert compare.main([run_id, run_id, "--tracking-uri", uri, "--samples", "50", "--sets", "test"]) == 0
    assert capsys.readouterr().out.count("no significant difference") == 4


@pytest.mark.slow
def test_the_confidence_bench_reads_a_finished_run_and_agrees_with_its_evaluation(smoke_run):
    """bench/confidence.py --workdir: the run's model on its ingested test split, both ways; its ρ of `score` with
    sentence chrF is the evaluate stage's confidence_spearman (the same greedy translations, the same scores)."""
    from bench import confidence

    results = smoke_run.results()  # evaluate decoded the first `sentences` of the split (evaluate.max_sentences)
    report = confidence.main(["--workdir", str(smoke_run.workdir), "--flag", "20", "--limit", str(results["sentences"])])
    assert report["test"] == "test" and list(report["directions"]) == ["en->es", "es->en"]
    for name, direction in (("en->es", "src2tgt"), ("es->en", "tgt2src")):
        entry = report["directions"][name]
        assert entry["sentences"] == results["sentences"] and entry["scores"]["score"]["flagged"] == round(0.2 * entry["sentences"])
        expected = results[f"confidence_spearman_{direction}"]
        assert expected is None or entry["scores"]["score"]["spearman"] == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_ray_overhead_bench_times_the_smoke_run_s_train_stage_against_the_harness(smoke_run):
    """bench/ray_overhead.py: the same training budget through the harness alone, against this train stage."""
    train_manifest = json.loads((smoke_run.stage_dir("train") / "manifest.json").read_text())
    overhead = subprocess.run([sys.executable, "-m", "bench.ray_overhead", "--workdir", str(smoke_run.workdir),
                               "--config", str(SMOKE), f"workdir={smoke_run.workdir}"], capture_output=True, text=True,
                              check=True, cwd=Path(run_pipeline.__file__).parent)
    measured = json.loads(overhead.stdout)
    assert measured["steps"] == measured["stage_steps"] == 30 and measured["stage_workers"] == 2
    assert measured["stage_seconds"] == train_manifest["seconds"] and measured["harness_seconds"] > 0
    assert measured["overhead"] == round(measured["stage_seconds"] / measured["harness_seconds"] - 1, 4)
    assert [entry["step"] for entry in measured["harness_valid_bleu"]] == [10, 20, 30]


@pytest.mark.slow
def test_the_smoke_run_again_skips_everything_and_bad_requests_on_it_fail_fast(smoke_run, capfd, tmp_path):
    """A second run skips every stage and opens no MLflow run; a GPU request on this CPU-only cluster fails fast;
    an incompatible teacher checkpoint (a REDER model directory, then a missing one) is a clear error."""
    import mlflow

    args = smoke_run.args
    assert run_pipeline.main(args) == 0  # second run: everything finished already
    assert capfd.readouterr().out.count("skipped (finished earlier)") == 14  # progress lines + summary
    mlflow.set_tracking_uri(f"sqlite:///{smoke_run.workdir}/mlflow.db")
    assert len(mlflow.search_runs(experiment_names=["duplex"], output_format="list")) == 10  # no run opened

    started = time.monotonic()
    assert run_pipeline.main(args + ["train.use_gpu=true", "train.start_timeout_s=1", "--stages", "train"]) == 2
    assert "GPU: need 2, cluster has 0" in capfd.readouterr().err
    assert time.monotonic() - started < 30

    reder_dir = str(smoke_run.stage_dir("train") / "model")
    teacher_dir = smoke_run.stage_dir("teacher") / "tgt2src" / "model"
    wrong = args + [f"teacher.src2tgt_checkpoint={reder_dir}", f"teacher.tgt2src_checkpoint={reder_dir}",
                    "--stages", "teacher"]
    assert run_pipeline.main(wrong) == 2
    assert "teacher.src2tgt_checkpoint" in capfd.readouterr().err
    missing = args + [f"teacher.src2tgt_checkpoint={tmp_path / 'nowhere'}", f"teacher.tgt2src_checkpoint={teacher_dir}",
                      "--stages", "teacher"]
    assert run_pipeline.main(missing) == 2
    err = capfd.readouterr().err
    assert "nowhere" in err and "teacher.src2tgt_checkpoint" in err


@pytest.mark.slow
def test_the_mlflow_ui_in_headless_chromium_shows_the_runs_the_plot_and_the_model(request):
    """`mlflow ui` on the smoke run's store, read by headless Chromium (bench/mlflow_ui.py): the
    experiment's runs table in the saved view "Test BLEU" that the pipeline tags the experiment with (the "Model
    training" pages, sorted by test BLEU, so nested runs are listed flat) names the pipeline run and every stage
    run and has the columns test_bleu_src2tgt and test_bleu_tgt2src with the pipeline run's values; the pipeline
    run's page lists its stage runs and shows both test BLEUs with their values; the train run's page shows
    training.png as an image; the registered model's page lists version 1 with the alias champion. Also the
    runs that trained, with their Dataset column (the teachers' raw pairs, REDER's distilled ones); the train run's
    System metrics tab; the evaluate run's translations table."""
    from bench import mlflow_ui

    if mlflow_ui.chromium() is None:
        reason = "chromium is not installed (Debian: apt-get install -y chromium; .ci/run installs it where apt can)"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    workdir = request.getfixturevalue("smoke_run").workdir  # after the skip: without Chromium, no run
    import mlflow

    store = f"sqlite:///{workdir}/mlflow.db"
    mlflow.set_tracking_uri(store)
    links, expected = mlflow_ui.expected_texts(mlflow.search_runs(experiment_names=["duplex"], output_format="list"))
    assert set(links) == {"runs", "pipeline", "run", "model", "translations", "datasets", "system", "models"}  # no sweep
    assert len(expected["models"]) == 3 + 1  # the train run's three kept checkpoints, its pyfunc
    assert len(expected["pipeline"]) == 1 + 7 + 2  # the pipeline run, its seven stage runs, two test BLEUs
    assert expected["runs"][-4:-2] == ["test_bleu_src2tgt", "test_bleu_tgt2src"]  # the view's columns, then values
    assert "viewStateShareKey=" in links["runs"]
    with mlflow_ui.mlflow_ui(store) as base, mlflow_ui.browser_cache() as cache:
        port = base.rstrip("/").rsplit(":", 1)[1]
        server = subprocess.run(["pgrep", "-f", f"mlflow ui .* --port {port} "], capture_output=True, text=True)
        session = subprocess.run(["ps", "-o", "args=", "-s", server.stdout.split()[0]], capture_output=True,
                                 text=True).stdout
        assert "huey" not in session and "_job_runner" not in session, session  # MLflow's job execution is off
        for page, fragment in links.items():
            dom = mlflow_ui.browse(base + fragment, cache=cache)
            assert mlflow_ui.missing_texts(dom, expected[page]) == [], (page, base + fragment)
