"""reder.translate's command line: line splitting (output lines = input lines), and one-line errors with exit
status 2 for bad options (a decoding flag the chosen decoder does not take among them), bad input and broken model
directories. In process, with stdin replaced. Also the blank penalty's decoders (reder.decoding.ctc)."""
import io
import json
import shutil

import pytest
import sentencepiece
import torch

from reder import TransformerConfig
from reder.autoregressive import Transformer
from reder.checkpoint import CONFIG_FILE, MODEL_FILE, SPM_FILE
from reder.decode import ctc_beam_search, strip_special
from reder.decoding import CtcBeam, CtcGreedy, make_decoder
from reder.decoding.ctc import greedy_by_penalty, reranked_by_penalty
from reder.decoding.run import decode, encode_lines, translate_ids, translate_lines
from reder.text import split_lines
from reder.translate import main
from tests.reder.helpers import decoding_model, random_batch, tiny_model

SEPARATORS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.fixture()
def model_dir(tiny_model_dir, tmp_path):
    """A copy of the model directory this test may break."""
    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def _run(monkeypatch, capsys, args, stdin: bytes = b"the cat\n") -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("separator", SEPARATORS + ["\r", "\x00", "\x1b", "\x7f"])
def test_split_lines_refuses_other_line_terminators_and_control_characters(separator):
    """reder.text's one definition of a line: a character that would end a line elsewhere, or any control
    character but TAB, is an error naming the line and the character, in text and in bytes."""
    for data in (f"ok\na{separator}b\nc\n", f"ok\r\na{separator}b\r\nc\r\n".encode()):
        with pytest.raises(ValueError, match=rf"^line 2: U\+{ord(separator):04X} \(.+\) at character 2: "):
            split_lines(data)


def test_split_lines_edges():
    assert split_lines("") == [] and split_lines("\n") == [""] and split_lines("a\n\nb") == ["a", "", "b"]
    assert split_lines("a\tb\r\n") == ["a\tb"]  # TAB is text; a CRLF is one ending
    assert split_lines("\ufeffa\n\ufeffb\n".encode()) == ["a", "\ufeffb"]  # a BOM only at the start
    with pytest.raises(ValueError, match=r"line 2: not UTF-8"):
        split_lines(b"ok\nab\xffc\n")


def test_every_input_line_gives_one_output_line(model_dir, monkeypatch, capsys):
    lines = ["\ufeffthe cat", "the cat\tsat", "a dog\r", "", "the bird", "\u00a0the \u200bcat\ufeff"]
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt"],
                          "\n".join(lines).encode() + b"\n")
    assert code == 0, err
    assert out.endswith("\n") and len(out.split("\n")) - 1 == len(lines)
    model_lines = [line.removesuffix("\r").removeprefix("\ufeff") if i < 3 else line for i, line in enumerate(lines)]
    from reder.checkpoint import load_model_dir
    model, _ = load_model_dir(model_dir)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_FILE))
    assert out.split("\n")[:-1] == translate_lines(model, sp, model_lines, "src2tgt", make_decoder(model))


@pytest.mark.parametrize("stdin, message", [
    (b"the cat\rthe dog\r", "line 1: U+000D (CARRIAGE RETURN) at character 8"),
    (b"the cat\nthe \x00dog\n", "line 2: U+0000 (NUL) at character 5"),
    ("the cat\nthe\u2028dog\n".encode(), "line 2: U+2028 (LINE SEPARATOR) at character 4"),
])
def test_strict_a_line_terminator_or_control_character_is_a_one_line_error(model_dir, monkeypatch, capsys, stdin,
                                                                           message):
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt", "--strict"],
                          stdin)
    assert code == 2 and out == ""
    assert err.startswith(f"error: <stdin> {message}") and err.count("\n") == 1


def test_strict_binary_stdin_is_a_one_line_error_naming_the_line(model_dir, monkeypatch, capsys):
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt", "--strict"],
                          b"the cat\n\x89PNG\x00\xff\n")
    assert code == 2 and out == ""
    assert err.startswith("error: <stdin> line 2: not UTF-8") and err.count("\n") == 1


# Every Unicode character that is no text inside a line (reder.text.BAD: the C0 and C1 controls but TAB, and the
# line terminators other than "\n"), generated rather than listed, and bytes that are not UTF-8.
ODD = [chr(c) for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]]


def test_by_default_every_line_is_translated_and_each_mended_one_named_on_stderr(model_dir, monkeypatch, capsys):
    """One U+2028 in a million lines once refused them all (exit 2). A translator translates every line, one
    output line per input line always: each odd character a space, undecodable bytes U+FFFD, a line longer
    than the model reads cut to it; stderr names every mended line. What the model sees is what it would see
    of the mended text (translate_lines of it)."""
    from reder.checkpoint import load_model_dir

    lines = [f"the{char}cat" for char in ODD if char != "\r"] + ["the cat\r\r"]  # a lone CR before a CRLF
    too_long = "cat " * 400
    data = "".join(line + "\n" for line in lines).encode() + b"a \xff dog\n" + too_long.encode() + b"\nthe bird\n"
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt"], data)
    assert code == 0, err
    outputs = out.split("\n")[:-1]
    assert len(outputs) == len(lines) + 3
    model, _ = load_model_dir(model_dir)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_FILE))
    limit = model.max_input_length() - 1
    mended = ["the cat"] * (len(lines) - 1) + ["the cat ", "a \ufffd dog"]
    assert outputs[:-2] == translate_lines(model, sp, mended, "src2tgt", CtcGreedy())
    assert outputs[-1] == translate_lines(model, sp, ["the bird"], "src2tgt", CtcGreedy())[0] and outputs[-2]  # the cut one too
    warnings = err.splitlines()
    assert len(warnings) == len(lines) + 2 and all(w.startswith("warning: <stdin> line ") for w in warnings)
    assert f"line {len(lines) + 1}: not UTF-8 text (byte 0xff at byte 3 of the line)" in err
    assert f"line {len(lines) + 2}: 400 pieces, more than the model reads ({limit}): its first {limit} translated" in err
    assert "line 1: U+0000 (NUL) at character 4 replaced by a space" in err


@pytest.mark.parametrize("option", [["--beam", "0"], ["--beam", "-2"], ["--batch-size", "0"], ["--batch-size", "-1"]])
def test_sizes_below_one_are_rejected_by_argparse(model_dir, monkeypatch, capsys, option):
    with pytest.raises(SystemExit) as exit:
        _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt", *option])
    assert exit.value.code == 2 and "expected a positive integer" in capsys.readouterr().err


def test_cuda_without_cuda_is_a_one_line_error(model_dir, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt",
                                                "--device", "cuda"])
    assert code == 2 and out == "" and err == "error: --device cuda: CUDA is not available on this machine (use --device cpu)\n"


def _break(model_dir, name):
    if name == "missing model.pt":
        (model_dir / MODEL_FILE).unlink()
    elif name == "truncated model.pt":
        (model_dir / MODEL_FILE).write_bytes((model_dir / MODEL_FILE).read_bytes()[:200])
    elif name == "malformed config.json":
        (model_dir / CONFIG_FILE).write_text('{"model": {', encoding="utf-8")
    elif name == "garbage spm.model":
        (model_dir / SPM_FILE).write_bytes(b"\x00garbage")
    return {"missing model.pt": MODEL_FILE, "truncated model.pt": MODEL_FILE, "malformed config.json": CONFIG_FILE,
            "garbage spm.model": SPM_FILE}[name]


@pytest.mark.parametrize("broken", ["missing model.pt", "truncated model.pt", "malformed config.json", "garbage spm.model"])
def test_a_broken_model_directory_is_a_one_line_error_naming_the_file(model_dir, monkeypatch, capsys, broken):
    name = _break(model_dir, broken)
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt"])
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("error: ") and name in err and str(model_dir) in err, err


def test_language_codes_name_the_direction_in_the_cli_and_the_python_api(model_dir, monkeypatch, capsys):
    """--src/--tgt (the codes config.json records) pick the direction; `reder.load(dir).translate` gives the
    same lines as the CLI; a pair the model does not translate is a one-line error naming what it does."""
    import reder

    text = b"the cat\na dog ran\n"
    by_direction = {d: _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", d], text)[1]
                    for d in ("src2tgt", "tgt2src")}
    for src, tgt, direction in (("en", "de", "src2tgt"), ("de", "en", "tgt2src")):
        code, out, _ = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--src", src, "--tgt", tgt], text)
        assert code == 0 and out == by_direction[direction]
    for args, message in [(["--src", "en", "--tgt", "fr"], f"error: {model_dir} translates en->de and de->en, not en->fr"),
                          (["--src", "en"], "error: name the direction either by --src LANG --tgt LANG (both)"),
                          ([], "error: name the direction: --src en --tgt de (or the reverse), or --direction")]:
        code, _, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), *args], text)
        assert code == 2 and err.startswith(message) and err.count("\n") == 1, err

    model = reder.load(model_dir)
    assert model.languages == ("en", "de") and "REDER" in repr(model)
    assert model.translate(["the cat", "a dog ran"], src="en", tgt="de") == by_direction["src2tgt"].splitlines()
    assert model.translate("the cat", src="de", tgt="en") == by_direction["tgt2src"].splitlines()[0]
    beam = model.translate(["the cat", "a dog ran"], src="en", tgt="de", beam=3)
    assert len(beam) == 2 and model.translate(["the cat", "a dog ran"], src="en", tgt="de", beam=3, decoder="beam") == beam
    code, out, _ = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt", "--beam", "3"], text)
    assert code == 0 and out.splitlines() == beam
    with pytest.raises(ValueError, match="translates en->de and de->en, not de->de"):
        model.translate("the cat", src="de", tgt="de")
    with pytest.raises(ValueError, match="^decoder 'viterbi': a CTC REDER decodes with greedy, beam$"):  # a DAG decoder
        model.translate("the cat", src="en", tgt="de", decoder="viterbi")


def _dag_model_dir(model_dir, tmp_path):
    """A DAG REDER model directory (en<->de) beside the CTC one, with its SentencePiece model; untrained."""
    from reder import DuplexLoss
    from reder.checkpoint import save_model_dir

    torch.manual_seed(0)
    model = tiny_model(vocab_size=30, head="dag", graph_upsample_ratio=2.0, link_heads=2)
    src, src_lengths = random_batch([5, 3], 30)
    DuplexLoss(model)(src, src_lengths, src, src_lengths, step=0)  # data-initialises the ActNorms
    return save_model_dir(tmp_path / "dag", model.eval(), model_dir / SPM_FILE, "en", "de")


def test_the_cli_names_every_decoder_and_passes_the_flags_given_to_it(model_dir, monkeypatch, capsys, tmp_path):
    """--decoder D with its flags decodes as the decoder built with those options (the DAG flag
    --dag-length-penalty is the decoder's length_penalty); --decoder beam --beam N is --beam N."""
    from reder.checkpoint import load_model_dir
    from reder.decoding import DagBeam, DagLookahead, DagViterbi

    lines = ["the cat sat", "a dog ran in the park", "the bird"]
    text = "".join(line + "\n" for line in lines).encode()
    dag_dir = _dag_model_dir(model_dir, tmp_path)
    dag, _ = load_model_dir(dag_dir)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_FILE))
    for flags, decoder in [
        (["--decoder", "viterbi", "--dag-length-penalty", "0.5", "--max-transition", "2"],
         DagViterbi(length_penalty=0.5, max_transition=2)),
        (["--decoder", "lookahead", "--no-repeat-ngram", "2"], DagLookahead(no_repeat_ngram=2)),
        (["--beam", "3", "--dag-length-penalty", "0.5"], DagBeam(beam_size=3, length_penalty=0.5)),
        (["--decoder", "beam", "--beam", "3", "--dag-length-penalty", "0.5"], DagBeam(beam_size=3, length_penalty=0.5)),
    ]:
        code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(dag_dir), "--direction", "tgt2src", *flags], text)
        assert code == 0 and out.splitlines() == translate_lines(dag, sp, lines, "tgt2src", decoder), (flags, err)
    ctc, _ = load_model_dir(model_dir)
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt", "--beam", "3",
                                                "--cutoff-top-n", "4", "--blank-penalty", "1.5"], text)
    expected = translate_lines(ctc, sp, lines, "src2tgt", CtcBeam(beam_size=3, cutoff_top_n=4, blank_penalty=1.5))
    assert code == 0 and out.splitlines() == expected, err


def test_a_flag_the_chosen_decoder_does_not_take_is_a_one_line_error(model_dir, monkeypatch, capsys, tmp_path):
    """Decoding flags are passed only when given, to the decoder chosen: one it does not take is an error (exit 2,
    one line naming the decoder, the flag's option, what the decoder takes, and the model), not ignored."""
    dag_dir, teacher_dir = _dag_model_dir(model_dir, tmp_path), _tiny_teacher_dir(model_dir, tmp_path)
    ctc = ["--checkpoint", str(model_dir), "--direction", "src2tgt"]
    dag = ["--checkpoint", str(dag_dir), "--direction", "src2tgt"]
    teacher = ["--checkpoint", str(teacher_dir), "--direction", "src2tgt"]
    for args, fragments in [
        ([*ctc, "--cutoff-top-n", "5"], ("decoder 'greedy' of ctc: unknown options ['cutoff_top_n']; it takes [",
                                          f"(ctc model {model_dir})")),
        ([*ctc, "--iterations", "3"], ("decoder 'greedy' of ctc: unknown options ['iterations']; it takes [",)),
        ([*ctc, "--beam", "2", "--max-transition", "2"], ("decoder 'beam' of ctc: unknown options ['max_transition']",)),
        ([*dag, "--blank-penalty", "1"], ("decoder 'greedy' of dag: unknown options ['blank_penalty']; it takes [",
                                          f"(dag model {dag_dir})")),
        ([*dag, "--dag-length-penalty", "0.5"], ("decoder 'greedy' of dag: unknown options ['length_penalty']",)),
        ([*dag, "--beam", "3", "--cutoff-prob", "0.9"], ("decoder 'beam' of dag: unknown options ['cutoff_prob']",)),
        ([*dag, "--decoder", "viterbi", "--no-repeat-ngram", "2"], ("decoder 'viterbi' of dag: unknown options ['no_repeat_ngram']",)),
        ([*teacher, "--blank-penalty", "1"], ("decoder 'greedy' of transformer: unknown options ['blank_penalty']; it takes [",
                                              f"(transformer model {teacher_dir})")),
        ([*dag, "--decoder", "lookahead", "--beam", "4"], ("decoder 'lookahead' with beam 4: a beam search is its own decoder",
                                                            f"(dag model {dag_dir})")),
        ([*ctc, "--decoder", "viterbi"], (f"error: decoder 'viterbi': a CTC REDER decodes with greedy, beam (ctc model {model_dir})\n",)),
        ([*ctc, "--decoder", "mask_predict"], ("decoder 'mask_predict': a CTC REDER decodes with greedy, beam",)),
        ([*teacher, "--decoder", "lookahead"], ("decoder 'lookahead': a Transformer", " decodes with greedy, beam (transformer model")),
        ([*ctc, "--beam", "2", "--cutoff-prob", "1.5"], ("decoder 'beam': cutoff_prob must be in (0, 1], got 1.5",)),
    ]:
        code, out, err = _run(monkeypatch, capsys, args)
        assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, (args, err)
        assert all(fragment in err for fragment in fragments), (args, err)


def test_a_teacher_translates_only_its_own_pair():
    from reder.checkpoint import direction_of

    meta = {"src_lang": "en", "tgt_lang": "de", "direction": "tgt2src"}
    assert direction_of(meta, "de", "en") == "tgt2src"
    with pytest.raises(ValueError, match=r"^teacher translates de->en, not en->de$"):
        direction_of(meta, "en", "de", "teacher")


@pytest.fixture()
def cmlm_dir(tiny_model_dir, tmp_path):
    """An untrained CMLM model directory (en->de, src2tgt) sharing the tiny REDER's SentencePiece model."""
    from reder.checkpoint import save_model_dir
    from reder.cmlm import CMLM
    from reder.config import CmlmConfig

    torch.manual_seed(0)
    model = CMLM(CmlmConfig(vocab_size=30, d_model=16, n_heads=2, ffn_dim=32, encoder_layers=1, decoder_layers=1,
                            max_positions=64)).eval()
    return save_model_dir(tmp_path / "cmlm", model, tiny_model_dir / SPM_FILE, "en", "de", extra={"direction": "src2tgt"})


def test_a_cmlm_translates_with_mask_predict_and_refines_another_models_output(model_dir, cmlm_dir, monkeypatch, capsys):
    from reder.checkpoint import load_model_dir
    from reder.ctc import pad_batch

    lines = ["the cat sat", "a dog ran in the park", "the bird"]
    stdin = "".join(line + "\n" for line in lines).encode()
    cmlm, _ = load_model_dir(cmlm_dir)
    reder_model, _ = load_model_dir(model_dir)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_FILE))
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(cmlm_dir), "--src", "en", "--tgt", "de",
                                                "--iterations", "3", "--beam", "2"], stdin)
    assert code == 0, err
    encoded = encode_lines(sp, lines)
    expected = [sp.decode(h) for h in translate_ids(cmlm, encoded, "src2tgt", "mask_predict", length_beam=2, iterations=3)]
    assert out.split("\n")[:-1] == expected
    greedy = translate_ids(reder_model, encoded, "src2tgt")
    refined = translate_ids(reder_model, encoded, "src2tgt", refiner=cmlm, refine_steps=2)
    order = sorted(range(3), key=lambda i: len(encoded[i]))  # translate_ids' one length-sorted batch
    by_hand = cmlm.refine(*pad_batch([encoded[i] for i in order]), [greedy[i] for i in order], 2)
    assert [refined[i] for i in order] == by_hand and [len(h) for h in refined] == [len(h) for h in greedy]
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt",
                                                "--refine-steps", "2", "--refine-model", str(cmlm_dir)], stdin)
    assert code == 0, err
    assert out.split("\n")[:-1] == [sp.decode(h) for h in refined]
    assert translate_ids(reder_model, encoded, "src2tgt", refiner=cmlm, refine_steps=0) == greedy


@pytest.mark.parametrize("args,message", [
    (["--refine-steps", "2"], "--refine-steps K (> 0) and --refine-model DIR"),
    (["--direction", "tgt2src", "--refine-steps", "1", "--refine-model", "CMLM"], "translates 'src2tgt', but 'tgt2src'"),
])
def test_refinement_options_are_checked(model_dir, cmlm_dir, monkeypatch, capsys, args, message):
    args = [str(cmlm_dir) if a == "CMLM" else a for a in args]
    direction = [] if "--direction" in args else ["--direction", "src2tgt"]
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), *direction, *args])
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_the_api_refines_with_a_cmlm_translator(model_dir, cmlm_dir):
    """Translator.translate with a refiner gives what the CMLM's refine does by hand to REDER's greedy output."""
    import reder
    from reder.ctc import pad_batch

    model, cmlm = reder.load(model_dir), reder.load(cmlm_dir)
    lines = ["a dog ran in the park", "the cat sat", "dogs and cats are friends", "the bird"]
    greedy_text = model.translate(lines, "en", "de")
    assert model.translate(lines, "en", "de", refiner=cmlm, refine_steps=0) == greedy_text
    encoded = encode_lines(model.sp, lines)
    order = sorted(range(len(lines)), key=lambda i: len(encoded[i]))  # the API's one length-sorted batch
    tokens, lengths = pad_batch([encoded[i] for i in order])
    with torch.inference_mode():
        greedy = decode(model.model, tokens, lengths, "src2tgt")
        refined = cmlm.model.refine(tokens, lengths, greedy, 3)
    by_hand = [""] * len(lines)
    for index, hypothesis in zip(order, refined):
        by_hand[index] = model.sp.decode(hypothesis)
    assert [model.sp.decode(h) for h in greedy] == [greedy_text[i] for i in order]
    assert model.translate(lines, "en", "de", refiner=cmlm, refine_steps=3) == by_hand
    assert by_hand != greedy_text  # refinement changes the output here: a translate that ignored it would fail
    assert isinstance(cmlm.translate("the cat", "en", "de", beam=3, iterations=2), str)
    assert cmlm.translate(lines, "en", "de", beam=3, iterations=2) == cmlm.translate(lines, "en", "de", beam=3, iterations=2,
                                                                                    decoder="mask_predict")
    with pytest.raises(ValueError, match="translates en->de, not de->en"):
        cmlm.translate("der hund", "de", "en")


def _brute_greedy(log_probs: torch.Tensor, length: int, blank: int, penalty: float) -> list[int]:
    """Frame by frame: the argmax of the log-probs with the blank's lowered by `penalty`, repeats merged,
    blanks dropped, then cut at EOS and specials dropped (the reference of a penalised greedy decoder)."""
    out, previous = [], None
    for frame in log_probs[:length].tolist():
        frame[blank] -= penalty
        best = max(range(len(frame)), key=frame.__getitem__)
        if best != previous and best != blank:
            out.append(best)
        previous = best
    return strip_special(out, blank)


PENALTIES = (-6.0, -1.0, 0.0, 0.5, 2.0, 6.0)


@pytest.mark.parametrize("direction", ["src2tgt", "tgt2src"])
def test_a_blank_penalty_decodes_greedily_the_argmax_of_the_shifted_log_probs_and_beams_over_their_renormalisation(direction):
    """Greedy with blank penalty c is the per-frame argmax of log P with c subtracted from the
    blank's (whether c is passed, the model's own, or one of greedy_by_penalty's grid); the beam searches the
    same shift renormalised, log softmax(log P − c·[blank])."""
    model = tiny_model(dropout=0.0, attention_dropout=0.0).eval()
    blank = model.cfg.blank_id
    tokens, lengths = random_batch([6, 4, 5, 3], model.cfg.vocab_size)
    sequences = [row[:n].tolist() for row, n in zip(tokens, lengths.tolist())]
    with torch.no_grad():
        log_probs, out_lengths = model(tokens, lengths, direction)  # (B, T', V), unpenalised
    grid = greedy_by_penalty(model, sequences, direction, PENALTIES, batch_size=3)
    seen = set()
    for penalty in PENALTIES:
        expected = [_brute_greedy(log_probs[b], int(out_lengths[b]), blank, penalty) for b in range(len(sequences))]
        seen.add(str(expected))
        assert decode(model, tokens, lengths, direction, blank_penalty=penalty) == expected, penalty
        assert grid[penalty] == expected, penalty
        assert translate_ids(model, sequences, direction, blank_penalty=penalty, batch_size=2) == expected, penalty
        model.blank_penalty[direction] = penalty  # the model's own: what a model directory sets
        assert decode(model, tokens, lengths, direction) == expected, penalty
        model.blank_penalty[direction] = 0.0
        shifted = log_probs.clone()
        shifted[..., blank] -= penalty
        beam = [strip_special(labels, blank) for labels, _ in ctc_beam_search(shifted.log_softmax(-1), out_lengths, blank, 4)]
        assert decode(model, tokens, lengths, direction, "beam", beam_size=4, blank_penalty=penalty) == beam, penalty
    assert len(seen) >= 2  # the penalties change the output: the comparisons above can fail
    # a blank penalty is a CTC REDER's: a teacher's or a DAG model's decoders do not take it
    teacher = Transformer(TransformerConfig(vocab_size=12, d_model=8, n_heads=2, ffn_dim=16, encoder_layers=1, decoder_layers=1))
    for other, family in ((teacher.eval(), "transformer"), (decoding_model("dag"), "dag")):
        with pytest.raises(ValueError, match=rf"^decoder 'greedy' of {family}: unknown options \['blank_penalty'\]"):
            translate_ids(other, sequences, direction, blank_penalty=1.0)
    with pytest.raises(ValueError, match="blank penalties need a CTC model; this model's head is 'dag'"):
        greedy_by_penalty(decoding_model("dag"), sequences, direction, PENALTIES)
    with pytest.raises(ValueError, match=r"^decoder 'greedy': blank_penalty must be a finite number or None, got inf$"):
        decode(model, tokens, lengths, direction, blank_penalty=float("inf"))



@pytest.mark.parametrize("direction", ["src2tgt", "tgt2src"])
def test_one_nbest_per_penalty_serves_every_reranker_as_translate_ids_decodes_each(direction):
    """reranked_by_penalty (the evaluate stage's beam tuning) runs the model once per batch and the beam once per
    batch, penalty and search, sharing its n-best between the plain beam, self-reranking and teacher reranking; each
    output must be what translate_ids decodes for that penalty and reranker on its own (the reference). The
    decoders' own blank penalty is not read: the grid's is."""
    model = tiny_model(dropout=0.0, attention_dropout=0.0).eval()
    teacher = Transformer(TransformerConfig(vocab_size=model.cfg.vocab_size, d_model=8, n_heads=2, ffn_dim=16,
                                            encoder_layers=1, decoder_layers=1)).eval()
    tokens, lengths = random_batch([6, 4, 5, 3, 7], model.cfg.vocab_size)
    sequences = [row[:n].tolist() for row, n in zip(tokens, lengths.tolist())]
    rerankers = {"beam": {"beam_size": 4}, "self": {"beam_size": 4, "rerank": "self", "rerank_weight": 0.7},
                 "teacher": {"beam_size": 4, "rerank": "teacher", "teacher": teacher}, "beam 2": {"beam_size": 2}}
    decoders = {name: CtcBeam(cutoff_top_n=6, blank_penalty=50.0, **how) for name, how in rerankers.items()}
    counted = []
    grid = reranked_by_penalty(model, sequences, direction, PENALTIES, decoders, batch_size=2, on_batch=counted.append)
    assert counted == [2, 2, 1] and list(grid) == list(PENALTIES) and all(list(grid[p]) == list(decoders) for p in grid)
    seen = set()
    for penalty in PENALTIES:
        for name, how in rerankers.items():
            expected = translate_ids(model, sequences, direction, "beam", 2, blank_penalty=penalty, cutoff_top_n=6, **how)
            assert grid[penalty][name] == expected, (penalty, name)
            seen.add((name, str(expected)))
    assert len({output for name, output in seen if name == "beam"}) >= 2  # the penalties change the beam's output
    assert len({output for _, output in seen}) > len({output for name, output in seen if name == "beam"})  # so do the rerankers
    with pytest.raises(ValueError, match="an n-best needs a CTC model; this model's head is 'dag'"):
        reranked_by_penalty(decoding_model("dag"), sequences, direction, [0.0], {"beam": CtcBeam(beam_size=4)})

def test_the_model_directory_carries_the_blank_penalty_to_the_cli_and_the_python_api(model_dir, monkeypatch, capsys):
    """config.json's blank_penalty (per direction) is what reder.load, the CLI (and so the Serve app
    and the MLflow pyfunc, which translate through reder.load) decode with; --blank-penalty overrides it;
    save_model_dir writes the model's own; a directory without it decodes unpenalised; a bad value is a
    one-line error naming the file."""
    import reder
    from reder.checkpoint import load_model_dir, save_model_dir

    lines = ["the cat sat on the mat", "a dog ran in the park", "dogs and cats"]
    text = "".join(line + "\n" for line in lines).encode()
    model, _ = load_model_dir(model_dir)
    assert model.blank_penalty == {"src2tgt": 0.0, "tgt2src": 0.0}
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / SPM_FILE))
    penalised = {d: translate_lines(model, sp, lines, d, CtcGreedy(blank_penalty=p)) for d, p in (("src2tgt", -4.0), ("tgt2src", 3.0))}
    plain = {d: translate_lines(model, sp, lines, d, CtcGreedy()) for d in ("src2tgt", "tgt2src")}
    assert penalised != plain
    model.blank_penalty = {"src2tgt": -4.0, "tgt2src": 3.0}
    save_model_dir(model_dir, model, model_dir / SPM_FILE, "en", "de")
    assert json.loads((model_dir / CONFIG_FILE).read_text())["blank_penalty"] == {"src2tgt": -4.0, "tgt2src": 3.0}
    loaded = reder.load(model_dir)
    assert loaded.model.blank_penalty == {"src2tgt": -4.0, "tgt2src": 3.0}
    assert loaded.translate(lines, src="en", tgt="de") == penalised["src2tgt"]
    assert loaded.translate(lines, src="de", tgt="en") == penalised["tgt2src"]
    for direction in ("src2tgt", "tgt2src"):
        code, out, _ = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", direction], text)
        assert code == 0 and out.splitlines() == penalised[direction]
        code, out, _ = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", direction,
                                                  "--blank-penalty", "0"], text)
        assert code == 0 and out.splitlines() == plain[direction]
    meta = json.loads((model_dir / CONFIG_FILE).read_text())
    (model_dir / CONFIG_FILE).write_text(json.dumps({**meta, "blank_penalty": {"src2tgt": "high"}}))
    code, _, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt"], text)
    assert code == 2 and err.startswith(f"error: {model_dir / CONFIG_FILE}: blank_penalty must map") and err.count("\n") == 1


def test_python_m_reder_translate_runs_without_the_runpy_warning(model_dir):
    """`import reder` does not import reder.translate (reder.api, which it imports, no longer does), so
    running it as __main__ does not warn "'reder.translate' found in sys.modules after import of package 'reder'"."""
    import subprocess
    import sys
    from pathlib import Path

    import reder

    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "reder.translate", "--checkpoint",
                           str(model_dir), "--direction", "src2tgt"], input="the cat\n", capture_output=True,
                          text=True, cwd=Path(reder.__file__).parents[1])
    assert done.returncode == 0 and done.stderr == "" and len(done.stdout.splitlines()) == 1, done.stderr


def _tiny_teacher_dir(model_dir, tmp_path):
    """A Transformer model directory (src2tgt) beside the REDER one, with its SentencePiece model."""
    from reder.checkpoint import save_model_dir

    torch.manual_seed(0)
    save_model_dir(tmp_path / "teacher", Transformer(TransformerConfig(vocab_size=12, d_model=8, n_heads=2, ffn_dim=16,
                                                                       encoder_layers=1, decoder_layers=1)),
                   model_dir / SPM_FILE, "en", "de", extra={"direction": "src2tgt"})
    return tmp_path / "teacher"


def test_int8_option_translates_every_line_and_refuses_a_teacher(model_dir, monkeypatch, capsys, tmp_path):
    """--int8 (reder.runtime.onednn.quantized): one output line per input line; a Transformer is refused in one line."""
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(model_dir), "--direction", "src2tgt", "--int8"],
                          b"the cat\na dog\n")
    assert code == 0 and len(out.splitlines()) == 2, err
    teacher_dir = _tiny_teacher_dir(model_dir, tmp_path)
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(teacher_dir), "--direction", "src2tgt", "--int8"])
    assert code == 2 and "--int8 is for a REDER model" in err


def test_compile_option_gives_the_same_lines_and_refuses_int8_and_a_teacher(model_dir, monkeypatch, capsys, tmp_path):
    """--compile (reder.runtime.compiled): the same output lines as without it (the static shapes run eagerly here: inductor's
    compile is tests/reder/test_static.py's slow test); with --int8, or for a Transformer, one error line."""
    from reder.runtime import compiled as static

    lines = b"the cat\na dog\nthe cat and a dog\n"
    arguments = ["--checkpoint", str(model_dir), "--direction", "src2tgt"]
    code, plain, err = _run(monkeypatch, capsys, arguments, lines)
    assert code == 0, err
    built = []
    monkeypatch.setattr("reder.api.compiled", lambda model: built.append(static.compiled(model, backend=None)) or built[-1])
    code, out, err = _run(monkeypatch, capsys, [*arguments, "--compile"], lines)
    assert code == 0 and out == plain and built and built[0].static_trunk is not None, err
    code, out, err = _run(monkeypatch, capsys, [*arguments, "--compile", "--int8"])
    assert code == 2 and "choose one" in err
    teacher_dir = _tiny_teacher_dir(model_dir, tmp_path)
    code, out, err = _run(monkeypatch, capsys, ["--checkpoint", str(teacher_dir), "--direction", "src2tgt", "--compile"])
    assert code == 2 and "--compile is for a REDER model" in err
