"""pipeline.serve: request checking, grouping of a dynamic batch, and the Ray Serve endpoint for real over
loopback (both directions, concurrent requests, every class of bad request a 4xx, the replica still up)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from pipeline import serve as service
from pipeline.serve import BadRequest, Job, parse
from reder.api import load
from reder.confidence import NOT_DUPLEX
from tests.conftest import free_port

LANGUAGES = ("en", "de")


def _job(text, src="en", tgt="de", beam=1, decoder="greedy", strict=False, scores=False) -> Job:
    single = isinstance(text, str)
    return Job(tuple([text] if single else text), src, tgt, beam, decoder, single, strict, (), scores)


@pytest.mark.parametrize("body, status, message", [
    (b"not json", 415, "body is not JSON"),
    (b"\xff\xfe", 415, "body is not JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (b'{"text": "a", "src": "en"}', 400, "tgt: a language code is required"),
    (b'{"text": "a", "src": "en", "tgt": "de", "lang": 1}', 400, "unknown fields ['lang']"),
    (b'{"text": "", "src": "en", "tgt": "de"}', 400, "text[0]: is empty"),
    (b'{"text": [], "src": "en", "tgt": "de"}', 400, "text: must be a string or a list of 1 to 256 strings"),
    (b'{"text": ["a", 3], "src": "en", "tgt": "de"}', 400, "text[1]: must be a string, got int"),
    (json.dumps({"text": "a" * 2001, "src": "en", "tgt": "de"}).encode(), 400, "text[0]: has 2001 characters, more than 2000"),
    (json.dumps({"text": ["a"] * 257, "src": "en", "tgt": "de"}).encode(), 400, "1 to 256 strings"),
    (b'{"text": "a\\nb", "src": "en", "tgt": "de", "strict": true}', 400, "text[0]: U+000A (LINE FEED) at character 2: a line break"),
    (b'{"text": "a\\rb", "src": "en", "tgt": "de", "strict": true}', 400, "text[0]: U+000D (CARRIAGE RETURN) at character 2"),
    (b'{"text": ["ok", "a\\u2028b"], "src": "en", "tgt": "de", "strict": true}', 400, "text[1]: U+2028 (LINE SEPARATOR) at character 2"),
    (b'{"text": "a\\u0085b", "src": "en", "tgt": "de", "strict": true}', 400, "text[0]: U+0085 (NEXT LINE) at character 2"),
    (b'{"text": "a\\u0000b", "src": "en", "tgt": "de", "strict": true}', 400, "text[0]: U+0000 (NUL) at character 2: a control character"),
    (b'{"text": "a", "src": "en", "tgt": "de", "strict": 1}', 400, "strict: must be true or false, got 1"),
    (b'{"text": "a", "src": "en", "tgt": "de", "scores": "yes"}', 400, "scores: must be true or false, got 'yes'"),
    (b'{"text": "a", "src": "en", "tgt": "de", "beam": "4"}', 400, "beam: must be an integer from 1 to 64, got '4'"),
    (b'{"text": "a", "src": "en", "tgt": "de", "beam": true}', 400, "beam: must be an integer"),
    (b'{"text": "a", "src": "en", "tgt": "de", "beam": 0}', 400, "beam: must be an integer"),
    (b'{"text": "a", "src": "en", "tgt": "de", "decoder": 3}', 400, "decoder: must be a string"),
    (b"{" + b" " * (1 << 20) + b"}", 413, "exceeds 1048576"),
])
def test_bad_requests_are_refused_with_their_status(body, status, message):
    with pytest.raises(BadRequest) as caught:
        parse(body, LANGUAGES)
    assert caught.value.status == status and message in str(caught.value)


def test_good_requests_parse():
    assert parse(b'{"text": "a b", "src": "en", "tgt": "de"}', LANGUAGES) == _job("a b")
    assert parse(b'{"text": ["x", "y"], "src": "de", "tgt": "en", "beam": 4}', LANGUAGES) == _job(["x", "y"], "de", "en", 4)
    assert parse(b'{"text": "a", "src": "en", "tgt": "de", "strict": true}', LANGUAGES) == _job("a", strict=True)
    assert parse(b'{"text": "a", "src": "en", "tgt": "de", "scores": true}', LANGUAGES) == _job("a", scores=True)


def test_a_sentence_with_a_line_terminator_or_control_character_is_mended_and_named_unless_strict():
    """Text to translate is kept whatever it holds (the translators' rule): such a character becomes a
    space and the request says so in `notes`; `"strict": true` refuses it (above)."""
    job = parse(b'{"text": ["ok", "a\\u2028b", "c\\u0000d\\re"], "src": "en", "tgt": "de"}', LANGUAGES)
    assert job.lines == ("ok", "a b", "c d e") and not job.strict
    assert job.notes == ("text[1]: U+2028 (LINE SEPARATOR) at character 2 replaced by a space",
                         "text[2]: U+0000 (NUL) at character 2 (and 1 more) replaced by a space")


def test_a_dynamic_batch_is_translated_by_group_and_a_refused_job_answered_alone(tiny_model_dir):
    """Jobs of both directions and beams in one batch get what the translator gives each alone; a job for a
    pair the model does not translate, or with a decoder it lacks, gets its own error and spoils no other. The
    decoders are reder/decoding/'s names: decoder "beam" with beam 3 is the beam of `beam=3` alone."""
    server = service.TranslationService.func_or_class(str(tiny_model_dir))
    translator = load(tiny_model_dir)
    jobs = [_job(["the cat sat", "a dog"]), _job("the bird", "de", "en"), _job(["dogs and cats"], beam=3),
            _job("a cat", "en", "fr"), _job("the mat"), _job("a song", decoder="lookahead"),
            _job(["dogs and cats", "a dog ran"], beam=3, decoder="beam")]
    out = server.translate_jobs(jobs)
    assert out[0] == (translator.translate(["the cat sat", "a dog"], "en", "de"), [])
    assert out[1] == (translator.translate(["the bird"], "de", "en"), [])
    assert out[2] == (translator.translate(["dogs and cats"], "en", "de", beam=3), [])
    assert out[4] == (translator.translate(["the mat"], "en", "de"), [])
    assert out[6] == (translator.translate(["dogs and cats", "a dog ran"], "en", "de", beam=3), [])
    assert out[6][0] != translator.translate(["dogs and cats", "a dog ran"], "en", "de")  # the beam, not greedy
    assert isinstance(out[3], BadRequest) and "translates en->de and de->en, not en->fr" in str(out[3])
    assert isinstance(out[5], BadRequest) and str(out[5]) == "decoder 'lookahead': a CTC REDER decodes with greedy, beam"
    assert out[5].status == 400
    # a job that asks for scores gets the API's records, in its own group; the same sentences without, plain text
    scored = server.translate_jobs([_job(["the cat sat", "a dog"], scores=True), _job(["the cat sat", "a dog"]),
                                    _job("a cat", "en", "fr", scores=True)])
    assert scored[0] == (translator.translate(["the cat sat", "a dog"], "en", "de", scores=True), [])
    assert scored[1] == out[0] and [record["translation"] for record in scored[0][0]] == out[0][0]
    assert isinstance(scored[2], BadRequest) and "not en->fr" in str(scored[2])


def test_a_refused_job_spoils_none_of_the_good_jobs_in_its_own_group(tiny_model_dir):
    """Good jobs and strict jobs the model refuses (an input over its length limit) in one (pair, beam, decoder,
    strict) group: the group's one call fails, and every good job still gets what the translator gives it alone.
    Without strict the same over-long sentence is cut to what the model reads, translated and named in the notes."""
    server = service.TranslationService.func_or_class(str(tiny_model_dir))
    translator = load(tiny_model_dir)
    too_long = ("cat " * 400).strip()
    jobs = [_job(["the cat sat", "a dog"], strict=True), _job(too_long, strict=True), _job("the mat", strict=True),
            _job(["a dog ran", too_long], strict=True), _job(["the bird", "dogs and cats"], strict=True)]
    assert len({(job.src, job.tgt, job.beam, job.decoder, job.strict) for job in jobs}) == 1  # one group
    with pytest.raises(ValueError, match="exceed"):  # so the group's one call fails
        translator.translate([line for job in jobs for line in job.lines], "en", "de")
    out = server.translate_jobs(jobs)
    for index in (0, 2, 4):
        assert out[index] == (translator.translate(list(jobs[index].lines), "en", "de"), [])
    for index in (1, 3):
        assert isinstance(out[index], BadRequest) and "exceed" in str(out[index]) and out[index].status == 400
    lenient = server.translate_jobs([_job(["a dog ran", too_long]), _job("the mat")])
    limit = translator.model.max_input_length() - 1
    assert lenient[0][1] == [f"text[1]: 400 pieces, more than the model reads ({limit}): its first {limit} translated"]
    assert lenient[0][0][0] == translator.translate("a dog ran", "en", "de") and lenient[1] == (
        translator.translate(["the mat"], "en", "de"), [])


def test_the_ct2_engine_serves_a_teacher_as_ctranslate2_translates_it(tiny_model_dir, tmp_path):
    """engine=ct2 (the optional extra, which CI installs): the jobs of one group get what reder.api.Ct2Translator
    gives their lines in one call (not each job alone: translate_plain caps a batch at its longest input's limit,
    and this untrained teacher never ends a sentence early); the pair the teacher does not translate is refused
    alone."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra: pip install -e .[ct2]")
    from reder import TransformerConfig
    from reder.autoregressive import Transformer
    from reder.checkpoint import SPM_FILE, save_model_dir
    from reder.api import Ct2Translator

    teacher = Transformer(TransformerConfig(vocab_size=29, d_model=8, n_heads=2, ffn_dim=16, encoder_layers=1,
                                            decoder_layers=1, max_positions=64)).eval()
    teacher_dir = save_model_dir(tmp_path / "teacher", teacher, tiny_model_dir / SPM_FILE, "en", "de",
                                 extra={"direction": "src2tgt"})
    server = service.TranslationService.func_or_class(str(teacher_dir), engine="ct2")
    reference = Ct2Translator(teacher_dir)
    jobs = [_job(["the cat sat", "a dog"], beam=2), _job("der hund", "de", "en", beam=2), _job("the bird", beam=2),
            _job(["a dog ran"], beam=2, decoder="beam"), _job("the cat", decoder="viterbi")]
    out = server.translate_jobs(jobs)
    together = reference.translate(["the cat sat", "a dog", "the bird"], "en", "de", beam=2)
    assert out[0] == (together[:2], []) and out[2] == (together[2:], []) and all(together)
    assert isinstance(out[1], BadRequest) and "not de->en" in str(out[1])
    assert out[3] == (reference.translate(["a dog ran"], "en", "de", beam=2), [])  # the decoders' names, "beam" too
    assert isinstance(out[4], BadRequest) and "decoder 'viterbi'" in str(out[4]) and "greedy, beam" in str(out[4])
    [(records, notes)] = server.translate_jobs([_job(["the cat sat", "a dog"], beam=2, scores=True)])  # not duplex
    assert notes == [] and [r["translation"] for r in records] == reference.translate(["the cat sat", "a dog"], "en", "de", beam=2)
    assert all(r["score"] is r["forward"] is r["round_trip"] is None and r["reason"] == NOT_DUPLEX for r in records)


def _post(url: str, payload: object, method: str = "POST") -> tuple[int, dict]:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data if method == "POST" else None, method=method,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.slow
def test_the_endpoint_serves_both_directions_and_refuses_bad_requests(tiny_model_dir, ray_session):
    from ray import serve

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(service.app({"model_dir": str(tiny_model_dir), "max_batch_size": "8",
                               "batch_wait_timeout_s": "0.05"}), name="duplex", route_prefix="/")
        url = f"http://127.0.0.1:{port}/"
        translator = load(tiny_model_dir)
        assert _post(url + "health", None, "GET") == (200, {"languages": ["en", "de"], "engine": "torch"})
        # a CPU replica runs with its memory settings in its own process environment (module doc)
        replicas = [p for p in psutil.process_iter(["cmdline"])
                    if " ".join(p.info["cmdline"] or []).startswith("ray::ServeReplica:duplex:")]
        assert replicas and all({k: p.environ().get(k) for k in service.CPU_REPLICA_ENV} == service.CPU_REPLICA_ENV
                                for p in replicas), [p.environ() for p in replicas]
        requests = [({"text": f"the cat sat {'on the mat ' * (i % 3)}".strip(), "src": "en", "tgt": "de"}
                     if i % 2 else {"text": ["a dog ran", "the bird"][: 1 + i % 2], "src": "de", "tgt": "en", "beam": 2})
                    for i in range(24)]
        # reder/decoding/'s names: decoder "beam" with beam 3 is what reder.api's translate(..., beam=3) gives
        requests += [{"text": ["dogs and cats", "a dog ran"], "src": "en", "tgt": "de", "beam": 3, "decoder": "beam"}] * 2
        with ThreadPoolExecutor(8) as pool:  # concurrent: the replica batches them
            answers = list(pool.map(lambda payload: _post(url, payload), requests))
        for payload, (status, body) in zip(requests, answers):
            expected = translator.translate(payload["text"], payload["src"], payload["tgt"], beam=payload.get("beam", 1))
            assert status == 200 and body == {"translation": expected}
        for payload, status, message in [
            (b"{", 415, "not JSON"), ({"text": "a", "src": "en", "tgt": "fr"}, 400, "not en->fr"),
            ({"text": "", "src": "en", "tgt": "de"}, 400, "text[0]"), ({"text": 5, "src": "en", "tgt": "de"}, 400, "text:"),
            ({"text": "cat " * 400, "src": "en", "tgt": "de", "strict": True}, 400, "exceed"),  # over the input limit
            ({"text": "the cat", "src": "en", "tgt": "de", "decoder": "viterbi"}, 400,
             "decoder 'viterbi': a CTC REDER decodes with greedy, beam"),
        ]:
            code, body = _post(url, payload)
            assert code == status and message in body["error"], (payload, code, body)
        code, body = _post(url, {"text": ["the\u2028cat", "cat " * 400], "src": "en", "tgt": "de"})  # mended, named
        assert code == 200 and body["translation"][0] == translator.translate("the cat", "en", "de")
        assert [note.split(":")[0] for note in body["notes"]] == ["text[0]", "text[1]"]
        assert _post(url, None, "GET")[0] == 405
        # scores: "translation" as without them, "scores" beside it (one record, or a list as text was)
        for text in ("the cat sat", ["the cat sat", "a dog ran"]):
            records = translator.translate(text, "en", "de", scores=True)
            code, body = _post(url, {"text": text, "src": "en", "tgt": "de", "scores": True})
            expected = ({"translation": records["translation"], "scores": {k: v for k, v in records.items() if k != "translation"}}
                        if isinstance(text, str) else
                        {"translation": [r["translation"] for r in records],
                         "scores": [{k: v for k, v in r.items() if k != "translation"} for r in records]})
            assert code == 200 and body == expected, body
        assert _post(url, {"text": "the cat", "src": "en", "tgt": "de"}) == \
            (200, {"translation": translator.translate("the cat", "en", "de")})  # still up
    finally:
        serve.shutdown()


@pytest.mark.slow
def test_a_storm_is_refused_with_503_at_once_and_a_killed_replica_is_restarted_without_a_wrong_answer(
        tiny_model_dir, ray_session):
    """bench/serve_load.py's checks, small: 40 requests at once against a replica that holds 4 (max_batch_size 2,
    gathering for 0.3 s) and queues 2 more are answered or refused with 503 and Retry-After, nothing else, and
    every answer right; then the replica SIGKILLed under two retrying clients is started again by Serve, no
    request lost, given up or answered wrongly; a short soak samples the new replica's memory."""
    from ray import serve

    from bench import serve_load

    lines = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song", "dogs and cats are friends"]
    expected = dict(zip(lines, load(tiny_model_dir).translate(lines, "en", "de")))
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(service.app({"model_dir": str(tiny_model_dir), "max_batch_size": "2", "batch_wait_timeout_s": "0.3",
                               "max_queued_requests": "2"}), name="bounded", route_prefix="/")
        url = f"http://127.0.0.1:{port}/"
        storm = serve_load.storm(url, lines, expected, 40)
        assert storm["failed_otherwise"] == 0 and storm["wrong"] == 0, storm
        assert storm["answered"] >= 4 and storm["refused_503"] >= 20, storm  # 6 held at most; the rest refused
        assert storm["answered"] + storm["refused_503"] == 40, storm
        assert storm["refused_with_retry_after"] == storm["refused_503"], storm
        assert storm["refused_latency"]["p99_ms"] < storm["answered_latency"]["p99_ms"], storm  # refused at once
        assert "max_queued_requests=2" in storm["refusal_text"], storm["refusal_text"]

        killed = serve_load.kill_replica(url, "bounded", lines, expected, 2, 9.0)
        assert killed["restarted_as"] not in (None, killed["killed_pid"]), killed
        assert killed["given_up"] == killed["wrong"] == 0, killed  # every request sent ends answered or given up
        # answers flowed again within the clients' retry window (how soon depends on the machine's load: a new
        # replica process imports torch and loads the model; 8.7 s on 2 cores for the peers-size model)
        assert 0 < killed["longest_seconds_without_an_answer_after_the_kill"] < 60, killed

        soak = serve_load.soak(url, "bounded", lines, expected, 2, 3.0, sample_s=0.5)
        assert soak["given_up"] == soak["wrong"] == 0 and soak["failed_attempts"] == {}, soak
        assert soak["replica_pid_unchanged"] and len(soak["rss_samples"]) >= 4, soak
        print(json.dumps({"storm": storm, "kill": killed, "soak": soak}))  # shown with -rA
    finally:
        serve.shutdown()
    with pytest.raises(ValueError, match=r"max_queued_requests: must be a positive count or -1"):
        service.app({"model_dir": str(tiny_model_dir), "max_queued_requests": "0"})
