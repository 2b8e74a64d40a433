"""One HTTP endpoint for both directions: a published model served by Ray Serve with dynamic batching.

    serve run pipeline.serve:app model_dir=runs/<workdir>/train-<hash>/model [engine=torch|ct2]
        [max_batch_size=64] [batch_wait_timeout_s=0.01] [num_replicas=1] [device=cpu] [threads=1]
        [max_queued_requests=256]

`model_dir` may be a registered model's URI instead, `model_dir=models:/reder-en-de@champion` (the alias that the
pipeline moves to a better version, tracking.alias) or `models:/reder-en-de/3`, with MLFLOW_TRACKING_URI set
(engine torch; reder.load fetches it).
(`serve run` is Ray Serve's CLI; on a cluster started with `ray up` it joins that cluster — `serve run
--address auto ...` on the head — and `serve deploy` takes the same import path and args from a config file.)
Then:

    curl -s localhost:8000/ -H 'content-type: application/json' \\
         -d '{"text": ["A man is walking."], "src": "en", "tgt": "de"}'
    -> {"translation": ["Ein Mann geht."]}

Request (POST, JSON): `text` (one string or a list of up to MAX_SENTENCES strings, each 1 to reder.api.MAX_CHARS
characters, one line), `src` and `tgt` (language codes the model directory records; a REDER model translates both
ways, a teacher only its own pair), optional `beam` (1 to MAX_BEAM: the beam size; > 1 with decoder greedy means
beam), `decoder` (a name of reder/decoding/, as the CLI takes it: greedy, beam; a DAG model's lookahead, viterbi)
`strict` (default false) and `scores` (default false). Response: `translation`, a
string or a list as `text` was; with `scores`, `scores` beside it (one {"score", "forward", "round_trip",
"reason"} per sentence, or one alone for a string: the model's round-trip confidence, reder/confidence.py; null
with the reason for a teacher); and `notes` where a sentence was mended: as `python -m reder.translate`, every
sentence is translated, a control character or line terminator inside it becoming a space and (engine torch) a
sentence longer than the model reads cut to it, each named in `notes` (`text[3]: U+2028 (LINE SEPARATOR) at
character 5 replaced by a space`); with `"strict": true` such a sentence is a 400 instead. Anything else is a 4xx with `{"error": "<what is wrong>"}`: 405 for a method other than POST,
415 for a body that is not JSON, 413 for a body over MAX_BODY_BYTES, 400 for a bad field — never a crash of
the replica. GET /health answers `{"languages": [...], "engine": ...}`.

`engine=torch` serves a model directory with `reder.api.Translator` (REDER, or an AR teacher with our beam
search); `engine=ct2` serves a teacher model directory through CTranslate2 (`reder.api.Ct2Translator`, the
optional extra), the AR baseline served the same way. Dynamic batching (`serve.batch`): concurrent
requests are gathered up to `max_batch_size` requests or `batch_wait_timeout_s`, then each (direction, beam,
decoder) group is translated in one call.

Under more load than it can take the service refuses rather than queue without end: a replica holds 2 ×
`max_batch_size` requests at once (one batch translating, one gathering), and at most `max_queued_requests` more
(default 4 × max_batch_size; -1: no limit) wait in Ray Serve's queue for one; past that a request is answered at
once with 503 and `Retry-After: 1` (Serve's backpressure, `max_queued_requests`), which a client retries later.
A replica that dies (a crash, the OOM killer) is started again by Serve; the requests it held fail (500/503) and
are the client's to retry. `bench/serve_load.py --checks soak,kill,storm` measures all three.

A replica of the torch engine on the CPU runs with `CPU_REPLICA_ENV` in its process environment, for a memory that
stays flat over hours: oneDNN's caches capped (it builds a primitive for each matmul shape it meets and keeps 1,024
of them by default, and torch's ideep cache as many, so the memory grew in steps with every rare shape met), and
glibc's mmap threshold fixed, so that a batch's large buffers go back to the system when freed rather than
fragmenting the heap (docs/results/serving.md).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.serve.config import BackpressureConfig
from starlette.requests import Request
from starlette.responses import JSONResponse

from reder.api import sentence_problem
from reder.confidence import NOT_DUPLEX, Confidence
from reder.text import normalise

MAX_SENTENCES = 256  # per request
# A CPU replica's environment (module doc): oneDNN's primitive cache and torch's ideep cache capped at 64 entries
# each (the decoding trunk's bucketed matmul rows, reder/runtime/onednn.py, meet a few dozen shapes), and glibc's
# mmap threshold fixed at 1 MiB (left to itself glibc raises it after each large free, and a batch's large buffers
# then come from the heap and fragment it; fixed at its 128 KiB default, decoding ran 65 % slower in
# docs/results/serving.md's measurement, every mid-size buffer a fresh mapping)
CPU_REPLICA_ENV = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64",
                   "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
MAX_BEAM = 64
MAX_BODY_BYTES = 1 << 20


class BadRequest(ValueError):
    """A request the service refuses: HTTP `status` with the message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Job:
    """One checked request: its sentences, in which direction and how to decode them."""

    lines: tuple[str, ...]
    src: str
    tgt: str
    beam: int
    decoder: str
    single: bool  # `text` was one string: answer with one string
    strict: bool = False  # refuse a sentence to mend rather than mend it
    notes: tuple[str, ...] = ()  # what parse mended, named by field
    scores: bool = False  # answer each translation's round-trip confidence too


def parse(body: bytes, languages: tuple[str, ...]) -> Job:
    """A request body → Job; BadRequest naming the field otherwise (the language pair itself is checked by the
    model, which knows its directions)."""
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(f"body of {len(body)} bytes exceeds {MAX_BODY_BYTES}", 413)
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadRequest(f"body is not JSON ({error})", 415) from None
    if not isinstance(payload, dict):
        raise BadRequest(f"body must be a JSON object with text, src and tgt, got {type(payload).__name__}")
    unknown = sorted(set(payload) - {"text", "src", "tgt", "beam", "decoder", "strict", "scores"})
    if unknown:
        raise BadRequest(f"unknown fields {unknown}; a request has text, src, tgt and optionally beam, decoder, strict, "
                         f"scores")
    strict, scores = payload.get("strict", False), payload.get("scores", False)
    for key, value in (("strict", strict), ("scores", scores)):
        if not isinstance(value, bool):
            raise BadRequest(f"{key}: must be true or false, got {value!r}")
    text = payload.get("text")
    single = isinstance(text, str)
    lines = [text] if single else text
    if not isinstance(lines, list) or not lines or len(lines) > MAX_SENTENCES:
        raise BadRequest(f"text: must be a string or a list of 1 to {MAX_SENTENCES} strings")
    notes, mended = [], []
    for number, line in enumerate(lines):
        problem = sentence_problem(line, strict)
        if problem:
            raise BadRequest(f"text[{number}]: {problem}")
        line, note = normalise(line)
        if note:
            notes.append(f"text[{number}]: {note}")
        mended.append(line)
    for key in ("src", "tgt"):
        if not isinstance(payload.get(key), str):
            raise BadRequest(f"{key}: a language code is required (this model: {', '.join(map(str, languages))})")
    beam, decoder = payload.get("beam", 1), payload.get("decoder", "greedy")
    if not isinstance(beam, int) or isinstance(beam, bool) or not 1 <= beam <= MAX_BEAM:
        raise BadRequest(f"beam: must be an integer from 1 to {MAX_BEAM}, got {beam!r}")
    if not isinstance(decoder, str):
        raise BadRequest(f"decoder: must be a string, got {type(decoder).__name__}")
    return Job(tuple(mended), payload["src"], payload["tgt"], beam, decoder, single, strict, tuple(notes), scores)


def load_backend(model_dir: str, engine: str, device: str, threads: int) -> Any:
    """The translator serving `model_dir`: reder.api's (engine torch) or CTranslate2's (engine ct2, teachers)."""
    if engine == "torch":
        import torch

        from reder.api import load

        torch.set_num_threads(threads)
        return load(model_dir, device)
    if engine == "ct2":
        from reder.api import Ct2Translator

        return Ct2Translator(model_dir, device, threads)
    raise ValueError(f"engine: must be torch or ct2, got {engine!r}")


@serve.deployment
class TranslationService:
    """The model behind /translate (module doc)."""

    def __init__(self, model_dir: str, engine: str = "torch", device: str = "cpu", threads: int = 1,
                 max_batch_size: int = 64, batch_wait_timeout_s: float = 0.01) -> None:
        self.backend = load_backend(model_dir, engine, device, threads)
        self.engine = engine
        self.languages = tuple(self.backend.languages)
        self.batched.set_max_batch_size(max_batch_size)
        self.batched.set_batch_wait_timeout_s(batch_wait_timeout_s)

    def translate_jobs(self, jobs: list[Job]) -> list[tuple[list, list[str]] | BadRequest]:
        """Each job's (translations, notes), a translation being a record with its round-trip confidence where the
        job asks for scores; the jobs of one (pair, beam, decoder, strict, scores) in one call, a job the model
        refuses (a pair it does not translate, an unknown decoder, a strict input over its length limit) answered
        alone. The torch engine cuts a lenient job's over-long sentence and notes it."""
        groups: dict[tuple[str, str, int, str, bool, bool], list[int]] = {}
        for index, job in enumerate(jobs):
            groups.setdefault((job.src, job.tgt, job.beam, job.decoder, job.strict, job.scores), []).append(index)
        out: list[tuple[list, list[str]] | BadRequest] = [([], []) for _ in jobs]
        for (src, tgt, beam, decoder, strict, scores), members in groups.items():
            lines = [line for i in members for line in jobs[i].lines]
            notes: list[tuple[int, str]] = []
            cut: dict[str, Any] = {"notes": notes} if self.engine == "torch" and not strict else {}
            if scores and self.engine == "torch":
                cut["scores"] = True
            try:
                translated = self.scored(self.backend.translate(lines, src, tgt, beam=beam, decoder=decoder, **cut),
                                         scores)
            except ValueError:
                translated = None  # find which job the model refuses: each alone
            start = 0
            for i in members:
                count = len(jobs[i].lines)
                if translated is not None:
                    mine = [f"text[{index - start}]: {note}" for index, note in notes if start <= index < start + count]
                    out[i], start = (translated[start : start + count], [*jobs[i].notes, *mine]), start + count
                    continue
                try:
                    notes.clear()
                    alone = self.scored(self.backend.translate(list(jobs[i].lines), src, tgt, beam=beam,
                                                               decoder=decoder, **cut), scores)
                    out[i] = (alone, [*jobs[i].notes, *(f"text[{index}]: {note}" for index, note in notes)])
                except ValueError as error:
                    out[i] = BadRequest(str(error))
        return out

    def scored(self, translated: list, scores: bool) -> list:
        """The backend's output with scores asked for: records as the torch engine gives them, and for CTranslate2
        (a teacher, not duplex) each translation's record with null scores and the reason."""
        if not scores or self.engine == "torch":
            return translated
        return [{"translation": text, **Confidence(None, None, None, NOT_DUPLEX).as_dict()} for text in translated]

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.01)
    async def batched(self, jobs: list[Job]) -> list[tuple[list, list[str]] | BadRequest]:
        return self.translate_jobs(jobs)

    async def __call__(self, request: Request) -> JSONResponse:
        if request.method == "GET" and request.url.path.rstrip("/").endswith("/health"):
            return JSONResponse({"languages": list(self.languages), "engine": self.engine})
        try:
            if request.method != "POST":
                raise BadRequest(f"{request.method}: POST a JSON request (GET .../health for the model's languages)", 405)
            job = parse(await request.body(), self.languages)
            result = await self.batched(job)
            if isinstance(result, BadRequest):
                raise result
        except BadRequest as error:
            return JSONResponse({"error": str(error)}, status_code=error.status)
        translation, notes = result
        answer: dict[str, Any] = {}
        if job.scores:  # "translation" as without scores; "scores" beside it, one record per sentence
            answer["scores"] = [{key: value for key, value in record.items() if key != "translation"}
                                for record in translation]
            translation = [record["translation"] for record in translation]
        if job.single:
            translation, answer = translation[0], {key: value[0] for key, value in answer.items()}
        return JSONResponse({"translation": translation, **answer, **({"notes": notes} if notes else {})})


def app(args: dict[str, str]) -> serve.Application:
    """The application builder `serve run pipeline.serve:app model_dir=DIR [key=value ...]` calls (module doc)."""
    known = {"model_dir", "engine", "device", "threads", "max_batch_size", "batch_wait_timeout_s", "num_replicas",
             "max_queued_requests"}
    unknown = sorted(set(args) - known)
    if unknown or "model_dir" not in args:
        raise ValueError(f"pipeline.serve:app takes model_dir=DIR and optionally {sorted(known - {'model_dir'})}"
                         + (f"; unknown: {unknown}" if unknown else "; model_dir is missing"))
    threads, max_batch_size = int(args.get("threads", 1)), int(args.get("max_batch_size", 64))
    max_queued = int(args.get("max_queued_requests", 4 * max_batch_size))
    if max_queued == 0 or max_queued < -1:
        raise ValueError(f"max_queued_requests: must be a positive count or -1 (no limit), got {max_queued}")
    # a replica takes as many requests at once as one batch holds, plus one batch waiting (Serve's default, 5,
    # would cap every batch at 5 requests); past the bounded queue, a 503 with Retry-After (module doc)
    options = {"num_replicas": int(args.get("num_replicas", 1)), "ray_actor_options": {"num_cpus": threads},
               "max_ongoing_requests": 2 * max_batch_size, "max_queued_requests": max_queued,
               "backpressure_config": BackpressureConfig(status_code=503, retry_after_s=1)}
    if args.get("device", "cpu").startswith("cuda"):
        options["ray_actor_options"]["num_gpus"] = 1
    elif args.get("engine", "torch") == "torch":  # read by oneDNN at its first use: the process's own environment
        options["ray_actor_options"]["runtime_env"] = {"env_vars": dict(CPU_REPLICA_ENV)}
    return TranslationService.options(**options).bind(
        args["model_dir"], args.get("engine", "torch"), args.get("device", "cpu"), threads,
        max_batch_size, float(args.get("batch_wait_timeout_s", 0.01)))
