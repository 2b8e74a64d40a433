"""reder/decoding/: one interface for every decoding method. Every registered decoder builds with its defaults and
decodes a tiny model of its family; `make_decoder` refuses unknown names and options (naming what there is), a
decoder refuses bad option values (naming the option); `choose` is the user-level mapping of a name and a beam
size; a built decoder decodes as the same by name; `decoder_names()` is the CLI's --decoder."""
import math
import re

import pytest
import torch

from reder import BOS_ID, EOS_ID, PAD_ID, CmlmConfig, TransformerConfig
from reder.autoregressive import Transformer
from reder.cmlm import CMLM
from reder.decoding import (DECODERS, CtcBeam, CtcGreedy, DagBeam, DagGreedy, DagLookahead, DagViterbi, MaskPredict,
                            TeacherBeam, TeacherGreedy, decoder_names, default_decoder, make_decoder)
from reder.decoding.base import Decoder, family_of
from reder.decoding.ct2 import Ct2Beam, Ct2Greedy
from reder.decoding.run import choose, decode, translate_ids
from tests.reder.helpers import decoding_model, random_batch

VOCAB = 20
CT2_VOCAB = 29  # tests/conftest.py's tiny_model_dir's SentencePiece pieces
LENGTHS = [6, 3, 7, 2, 5]

# What each decoder takes (its options, in order), as docs and the decoders' module docs name them.
OPTIONS = {
    ("ctc", "greedy"): ["blank_penalty"],
    ("ctc", "beam"): ["beam_size", "cutoff_top_n", "cutoff_prob", "blank_penalty", "rerank", "rerank_weight", "teacher"],
    ("dag", "greedy"): ["max_transition", "no_repeat_ngram"],
    ("dag", "lookahead"): ["max_transition", "no_repeat_ngram"],
    ("dag", "viterbi"): ["max_transition", "length_penalty"],
    ("dag", "beam"): ["max_transition", "beam_size", "length_penalty"],
    ("dag", "path_beam"): ["max_transition", "beam_size", "top_transitions", "top_tokens", "length_penalty"],
    ("transformer", "greedy"): ["max_len_a", "max_len_b"],
    ("transformer", "beam"): ["beam_size", "length_penalty", "max_len_a", "max_len_b"],
    ("ct2", "greedy"): ["max_len_a", "max_len_b", "mirror"],
    ("ct2", "beam"): ["max_len_a", "max_len_b", "mirror", "beam_size", "length_penalty"],
    ("cmlm", "mask_predict"): ["iterations", "length_beam"],
}


def tiny_transformer(vocab_size: int = VOCAB) -> Transformer:
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=vocab_size, d_model=16, n_heads=2, ffn_dim=32, encoder_layers=1,
                                         decoder_layers=1, max_positions=64)).eval()


def tiny_cmlm() -> CMLM:
    torch.manual_seed(0)
    return CMLM(CmlmConfig(vocab_size=VOCAB, d_model=16, n_heads=2, ffn_dim=32, encoder_layers=1, decoder_layers=1,
                           max_positions=32)).eval()


def tiny_ct2(spm_model, out_dir):
    """A tiny teacher over the SentencePiece model's 29 pieces converted to CTranslate2."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is an optional extra: pip install -e .[ct2]")
    from reder.ct2 import convert_model
    from reder.decoding.ct2 import ct2_model

    return ct2_model(convert_model(tiny_transformer(CT2_VOCAB), spm_model, out_dir))


def model_of(family: str, tiny_model_dir=None, tmp_path=None):
    if family in ("ctc", "dag"):
        return decoding_model(family)
    if family == "transformer":
        return tiny_transformer()
    if family == "cmlm":
        return tiny_cmlm()
    return tiny_ct2(tiny_model_dir / "spm.model", tmp_path / "ct2")


def vocabulary(model) -> int:
    return CT2_VOCAB if family_of(model) == "ct2" else model.cfg.vocab_size


def sequences_for_batch(tokens: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    return [row[:n].tolist() for row, n in zip(tokens, lengths.tolist())]


def sequences_for(model) -> list[list[int]]:
    return sequences_for_batch(*random_batch(LENGTHS, vocabulary(model)))


def test_the_registry_names_each_decoder_by_its_family_and_name():
    assert set(DECODERS) == set(OPTIONS)
    for (family, name), cls in DECODERS.items():
        assert issubclass(cls, Decoder) and (cls.family, cls.name) == (family, name)
    assert decoder_names() == ("greedy", "beam", "lookahead", "viterbi", "path_beam", "mask_predict")
    assert [decoder_names(f) for f in ("ctc", "dag", "transformer", "ct2", "cmlm")] == [
        ("greedy", "beam"), ("greedy", "lookahead", "viterbi", "beam", "path_beam"), ("greedy", "beam"), ("greedy", "beam"),
        ("mask_predict",)]
    assert decoder_names("crf") == ()
    assert [default_decoder(m) for m in (decoding_model(), decoding_model("dag"), tiny_transformer(), tiny_cmlm())] == [
        "greedy", "greedy", "greedy", "mask_predict"]
    with pytest.raises(TypeError, match="no decoder decodes a Linear"):
        make_decoder(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("key", sorted(OPTIONS), ids="-".join)
def test_every_registered_decoder_builds_with_its_defaults_and_decodes_its_family(key, tiny_model_dir, tmp_path):
    family, name = key
    model = model_of(family, tiny_model_dir, tmp_path)
    assert family_of(model) == family
    decoder = make_decoder(model, name)
    assert decoder == DECODERS[key]() and type(decoder) is DECODERS[key]
    assert list(decoder.options()) == OPTIONS[key]
    sequences = sequences_for(model)
    hypotheses = translate_ids(model, sequences, "src2tgt", decoder, batch_size=2)
    specials = (PAD_ID, BOS_ID, EOS_ID, vocabulary(model) - 1)  # the last id: the blank / skip token / CMLM's mask
    assert len(hypotheses) == len(sequences)
    assert all(isinstance(t, int) and 0 <= t < vocabulary(model) and t not in specials for h in hypotheses for t in h)
    assert translate_ids(model, sequences, "src2tgt", name, batch_size=2) == hypotheses  # by name: the same
    tokens, lengths = random_batch(LENGTHS, vocabulary(model))  # one padded batch, as its sequences
    assert decode(model, tokens, lengths, "src2tgt", decoder) == translate_ids(model, sequences_for_batch(tokens, lengths),
                                                                               "src2tgt", decoder)


def test_make_decoder_refuses_an_unknown_name_listing_the_familys_decoders():
    for model, message in [
        (decoding_model(), "a CTC REDER decodes with greedy, beam"),
        (decoding_model("dag"), "a DAG REDER decodes with greedy, lookahead, viterbi, beam, path_beam"),
        (tiny_transformer(), "a Transformer[a-z ]* decodes with greedy, beam"),  # a Transformer (teacher)
        (tiny_cmlm(), "a CMLM decodes with mask_predict"),
    ]:
        with pytest.raises(ValueError, match=f"^decoder 'nope': {message}$"):
            make_decoder(model, "nope")
    with pytest.raises(ValueError, match="^decoder 'greedy': a CMLM decodes with mask_predict$"):
        make_decoder(tiny_cmlm(), "greedy")
    with pytest.raises(ValueError, match="^decoder 'mask_predict': a CTC REDER decodes with greedy, beam$"):
        make_decoder(decoding_model(), "mask_predict")


def test_make_decoder_refuses_an_unknown_option_listing_the_options_it_takes():
    """Every decoder's message lists exactly its options (its dataclass fields, not its class attributes `name`
    and `family`), and `family` given as an option is an unknown option, not a TypeError from the constructor."""
    models = {"ctc": decoding_model(), "dag": decoding_model("dag"), "transformer": tiny_transformer(), "cmlm": tiny_cmlm()}
    for (family, name), options in OPTIONS.items():
        if family == "ct2":
            continue  # a ct2 model needs CTranslate2: its decoders' options are checked in the test above
        expected = f"decoder '{name}' of {family}: unknown options ['bogus', 'zzz']; it takes {options}"
        with pytest.raises(ValueError) as error:
            make_decoder(models[family], name, zzz=1, bogus=2)
        assert str(error.value) == expected
    # (`name` is make_decoder's own argument; `family` would reach the decoder's constructor)
    with pytest.raises(ValueError, match=r"^decoder 'greedy' of ctc: unknown options \['family'\]"):
        make_decoder(models["ctc"], "greedy", family="dag")


@pytest.mark.parametrize("build, message", [
    (lambda: CtcBeam(beam_size=0), "decoder 'beam': beam_size must be >= 1, got 0"),
    (lambda: CtcBeam(beam_size=True), "decoder 'beam': beam_size must be >= 1, got True"),
    (lambda: CtcBeam(beam_size="4"), "decoder 'beam': beam_size must be >= 1, got '4'"),
    (lambda: CtcBeam(cutoff_top_n=0), "decoder 'beam': cutoff_top_n must be >= 1, got 0"),
    (lambda: CtcBeam(cutoff_prob=1.5), "decoder 'beam': cutoff_prob must be in (0, 1], got 1.5"),
    (lambda: CtcBeam(cutoff_prob=0.0), "decoder 'beam': cutoff_prob must be in (0, 1], got 0.0"),
    (lambda: CtcBeam(rerank="x"), "decoder 'beam': rerank must be one of ['none', 'self', 'teacher'], got 'x'"),
    (lambda: CtcBeam(rerank_weight=-1.0), "decoder 'beam': rerank_weight must be >= 0, got -1.0"),
    (lambda: CtcBeam(rerank="teacher", teacher=decoding_model()), "decoder 'beam': teacher must be a Transformer"),
    (lambda: CtcBeam(rerank="teacher"), "decoder 'beam': rerank='teacher' needs a teacher, and a teacher is only for "
                                        "rerank='teacher'"),
    (lambda: CtcBeam(teacher=tiny_transformer()), "decoder 'beam': rerank='teacher' needs a teacher, and a teacher is "
                                                  "only for rerank='teacher'"),
    (lambda: CtcGreedy(blank_penalty=math.nan), "decoder 'greedy': blank_penalty must be a finite number or None, got nan"),
    (lambda: CtcGreedy(blank_penalty="1"), "decoder 'greedy': blank_penalty must be a finite number or None, got '1'"),
    (lambda: DagGreedy(max_transition=-1), "decoder 'greedy': max_transition must be >= 0, got -1"),
    (lambda: DagLookahead(no_repeat_ngram=-2), "decoder 'lookahead': no_repeat_ngram must be >= 0, got -2"),
    (lambda: DagViterbi(length_penalty=-0.5), "decoder 'viterbi': length_penalty must be >= 0, got -0.5"),
    (lambda: DagBeam(beam_size=0), "decoder 'beam': beam_size must be >= 1, got 0"),
    (lambda: TeacherGreedy(max_len_a=-1.0), "decoder 'greedy': max_len_a must be >= 0, got -1.0"),
    (lambda: TeacherBeam(beam_size=0), "decoder 'beam': beam_size must be >= 1, got 0"),
    (lambda: TeacherBeam(length_penalty=-1.0), "decoder 'beam': length_penalty must be >= 0, got -1.0"),
    (lambda: Ct2Beam(beam_size=0), "decoder 'beam': beam_size must be >= 1, got 0"),
    (lambda: Ct2Greedy(max_len_b=-3), "decoder 'greedy': max_len_b must be >= 0, got -3"),
    (lambda: MaskPredict(iterations=0), "decoder 'mask_predict': iterations must be >= 1, got 0"),
    (lambda: MaskPredict(length_beam=0), "decoder 'mask_predict': length_beam must be >= 1, got 0"),
    (lambda: make_decoder(decoding_model(), "beam", cutoff_prob=1.5), "decoder 'beam': cutoff_prob must be in (0, 1], got 1.5"),
    (lambda: choose(decoding_model(), "beam", 3, rerank="x"), "decoder 'beam': rerank must be one of"),
])
def test_a_bad_option_value_is_a_value_error_naming_it(build, message):
    with pytest.raises(ValueError) as error:
        build()
    assert str(error.value).startswith(message), str(error.value)


def test_decoders_are_frozen_values():
    decoder = CtcBeam(beam_size=3, rerank="self")
    assert decoder == CtcBeam(beam_size=3, rerank="self") != CtcBeam(beam_size=4, rerank="self")
    with pytest.raises(AttributeError):
        decoder.beam_size = 4
    assert decoder.options()["beam_size"] == 3 and decoder.options()["rerank"] == "self"


def test_choose_maps_a_name_and_a_beam_size_to_a_decoder():
    ctc, dag, teacher, cmlm = decoding_model(), decoding_model("dag"), tiny_transformer(), tiny_cmlm()
    assert choose(ctc) == CtcGreedy() and choose(ctc, "greedy", 1, blank_penalty=0.5) == CtcGreedy(blank_penalty=0.5)
    for name in (None, "greedy", "beam"):  # beam > 1 with no name or greedy: the family's beam of that size
        assert choose(ctc, name, 4) == CtcBeam(beam_size=4)
        assert choose(dag, name, 4) == DagBeam(beam_size=4)
        assert choose(teacher, name, 4) == TeacherBeam(beam_size=4)
    assert choose(ctc, None, 3, rerank="self", rerank_weight=0.5) == CtcBeam(beam_size=3, rerank="self", rerank_weight=0.5)
    assert choose(ctc, "beam", 1) == CtcBeam(beam_size=1)  # a named beam takes `beam` as its size
    assert choose(dag, "lookahead") == DagLookahead() and choose(dag, "viterbi", 1, length_penalty=0.5) == DagViterbi(length_penalty=0.5)
    assert choose(teacher) == TeacherGreedy()
    # a CMLM: mask-predict, `beam` its length candidates
    assert choose(cmlm) == MaskPredict(length_beam=1)
    assert choose(cmlm, None, 3, iterations=4) == MaskPredict(length_beam=3, iterations=4)
    assert choose(cmlm, "greedy", 3) == choose(cmlm, "mask_predict", 3) == MaskPredict(length_beam=3)
    with pytest.raises(ValueError, match=r"^decoder 'lookahead' with beam 4: a beam search is its own decoder \(give beam > 1 "
                                         r"with decoder greedy or beam, or beam 1 with this one\)$"):
        choose(dag, "lookahead", 4)
    with pytest.raises(ValueError, match="^decoder 'viterbi': a CTC REDER decodes with greedy, beam$"):
        choose(ctc, "viterbi")
    with pytest.raises(ValueError, match="^decoder 'beam': a CMLM decodes with mask_predict$"):
        choose(cmlm, "beam", 2)
    for beam in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match=re.escape(f"beam must be an int >= 1, got {beam!r}")):
            choose(ctc, None, beam)
    with pytest.raises(ValueError, match=r"decoder 'greedy' of ctc: unknown options \['rerank'\]"):
        choose(ctc, None, 1, rerank="self")


@pytest.mark.parametrize("family, name, options", [
    ("ctc", "greedy", {"blank_penalty": 1.0}),
    ("ctc", "beam", {"beam_size": 3, "cutoff_top_n": 5, "rerank": "self", "rerank_weight": 0.5}),
    ("dag", "lookahead", {"no_repeat_ngram": 2}),
    ("dag", "viterbi", {"length_penalty": 0.5, "max_transition": 3}),
    ("dag", "beam", {"beam_size": 3}),
    ("transformer", "beam", {"beam_size": 3, "max_len_b": 4}),
    ("cmlm", "mask_predict", {"iterations": 2, "length_beam": 2}),
])
def test_translate_ids_with_a_built_decoder_equals_the_same_by_name(family, name, options):
    model = model_of(family)
    sequences = sequences_for(model)
    built = make_decoder(model, name, **options)
    direction = "tgt2src" if family in ("ctc", "dag") else "src2tgt"  # a teacher or CMLM has one
    expected = translate_ids(model, sequences, direction, name, batch_size=2, **options)
    assert translate_ids(model, sequences, direction, built, batch_size=2) == expected
    tokens, lengths = random_batch(LENGTHS, vocabulary(model))
    assert decode(model, tokens, lengths, "src2tgt", built) == decode(model, tokens, lengths, "src2tgt", name, **options)


def test_a_built_decoder_takes_no_options_beside_it_and_decodes_its_own_family_only():
    ctc, dag = decoding_model(), decoding_model("dag")
    sequences = sequences_for(ctc)
    with pytest.raises(TypeError, match=r"options \['beam_size'\] go to the decoder when it is built"):
        translate_ids(ctc, sequences, "src2tgt", CtcBeam(), beam_size=3)
    with pytest.raises(ValueError, match="^decoder 'greedy' is for dag models, not ctc$"):
        translate_ids(ctc, sequences, "src2tgt", DagGreedy())
    with pytest.raises(ValueError, match="^decoder 'beam' is for ctc models, not dag$"):
        translate_ids(dag, sequences, "src2tgt", CtcBeam())
    with pytest.raises(ValueError, match="^decoder 'greedy' is for transformer models, not cmlm$"):
        decode(tiny_cmlm(), *random_batch(LENGTHS, VOCAB), "src2tgt", TeacherGreedy())


def test_decoder_names_are_what_the_clis_decoder_accepts(capsys, tmp_path):
    """--decoder's choices are decoder_names(): argparse refuses another name listing them, and accepts each
    (the error is then the missing model directory's, not argparse's)."""
    from reder.translate import main

    with pytest.raises(SystemExit) as exit:
        main(["--checkpoint", str(tmp_path), "--direction", "src2tgt", "--decoder", "nope"])
    err = capsys.readouterr().err
    assert exit.value.code == 2
    listed = re.search(r"argument --decoder: invalid choice: 'nope' \(choose from (.*)\)", err)
    assert listed, err
    assert tuple(re.findall(r"'?([a-z_]+)'?", listed.group(1))) == decoder_names()
    for name in decoder_names():
        assert main(["--checkpoint", str(tmp_path / "missing"), "--direction", "src2tgt", "--decoder", name]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "invalid choice" not in err and err.count("\n") == 1, err


def test_choose_gives_the_beam_to_every_decoder_with_a_beam_size():
    dag = decoding_model("dag")
    assert choose(dag, "path_beam", 3) == make_decoder(dag, "path_beam", beam_size=3)
    assert choose(dag, "path_beam", 3, top_tokens=1) == make_decoder(dag, "path_beam", beam_size=3, top_tokens=1)
    assert choose(dag, "beam", 2) == make_decoder(dag, "beam", beam_size=2)
