"""Model directories (REDER and Transformer), checkpoint averaging, batched translation, teacher reranking
and the command line."""
import io
import json
from dataclasses import replace

import pytest
import sentencepiece
import torch

from reder import EOS_ID, PAD_ID, DuplexLoss, TransformerConfig
from reder.autoregressive import Transformer
from reder.checkpoint import CONFIG_FILE, MODEL_FILE, average_state_dicts, load_model_dir, load_teacher_dir, read_meta, save_model_dir
from reder.ctc import pad_batch
from reder.decode import ctc_nbest, strip_special
from reder.decoding import CtcBeam, TeacherBeam
from reder.decoding.ctc import nbest
from reder.decoding.run import decode, translate_ids, translate_lines
from reder.rerank import rerank
from reder.translate import main as translate_main
from tests.reder.helpers import random_batch, tiny_model


def _initialized(seed: int):
    torch.manual_seed(seed)
    model = tiny_model()
    src, src_lengths = random_batch([5, 3, 4], 12)
    tgt, tgt_lengths = random_batch([4, 4, 2], 12)
    DuplexLoss(model)(src, src_lengths, tgt, tgt_lengths, step=0)  # data-initialises the ActNorms
    return model.eval()


def test_average_is_the_elementwise_mean_and_checks_its_inputs():
    states = [_initialized(seed).state_dict() for seed in (1, 2, 3)]
    averaged = average_state_dicts(states)
    for name, tensor in averaged.items():
        if tensor.is_floating_point():
            expected = (states[0][name] + states[1][name] + states[2][name]) / 3
            torch.testing.assert_close(tensor, expected, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(tensor, states[0][name])
    assert average_state_dicts(states[:1]).keys() == states[0].keys()
    with pytest.raises(ValueError, match="different keys"):
        average_state_dicts([states[0], dict(list(states[1].items())[1:])])
    with pytest.raises(ValueError, match="no states"):
        average_state_dicts([])


def test_model_directory_round_trip_translates_identically(tmp_path):
    model = _initialized(0)
    spm_file = tmp_path / "fake.model"
    spm_file.write_bytes(b"not read by the model")
    directory = save_model_dir(tmp_path / "model", model, spm_file, "en", "de", extra={"note": 1})
    assert not list(directory.glob(".*.tmp"))  # atomic writes leave no temporary files
    loaded, meta = load_model_dir(directory)
    assert meta["src_lang"] == "en" and meta["tgt_lang"] == "de" and meta["note"] == 1
    assert loaded.cfg == model.cfg and not loaded.training
    tokens, lengths = random_batch([6, 4, 5], 12)
    for direction in ("src2tgt", "tgt2src"):
        torch.testing.assert_close(loaded(tokens, lengths, direction)[0], model(tokens, lengths, direction)[0])
    (directory / MODEL_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="not a model directory.*model.pt"):
        read_meta(directory)
    assert (directory / CONFIG_FILE).is_file()


def test_translate_ids_batches_by_length_and_keeps_input_order():
    model = _initialized(0)
    tokens, lengths = random_batch([7, 2, 5, 3, 6], 12)
    sequences = [tokens[i, : lengths[i]].tolist() for i in range(5)]
    one_by_one = [decode(model, *pad_batch([s]), "src2tgt")[0] for s in sequences]
    assert translate_ids(model, sequences, "src2tgt", batch_size=2) == one_by_one
    too_long = [4] * (model.cfg.max_positions // model.cfg.upsample_ratio) + [EOS_ID]
    with pytest.raises(ValueError, match="input 2: 33 pieces"):
        translate_ids(model, [sequences[0], too_long], "tgt2src")


def test_dag_model_directory_round_trips_the_head_fields_and_decodes_identically(tmp_path):
    model = tiny_model(head="dag", graph_upsample_ratio=2.5, link_heads=2)
    src, src_lengths = random_batch([5, 3, 4], 12)
    tgt, tgt_lengths = random_batch([4, 4, 2], 12)
    DuplexLoss(model)(src, src_lengths, tgt, tgt_lengths, step=0)
    model.eval()
    spm_file = tmp_path / "fake.model"
    spm_file.write_bytes(b"not read by the model")
    loaded, meta = load_model_dir(save_model_dir(tmp_path / "model", model, spm_file, "en", "de"))
    assert meta["model"]["head"] == "dag" and meta["model"]["graph_upsample_ratio"] == 2.5 and meta["model"]["link_heads"] == 2
    assert loaded.cfg == model.cfg
    assert torch.equal(loaded.head.links["src"].query.weight, model.head.links["src"].query.weight)
    sequences = [src[i, : src_lengths[i]].tolist() for i in range(3)]
    for decoder in ("greedy", "lookahead", "viterbi"):
        assert translate_ids(loaded, sequences, "src2tgt", decoder=decoder) == translate_ids(model, sequences, "src2tgt", decoder=decoder)
    too_long = [4] * model.max_input_length() + [EOS_ID]
    with pytest.raises(ValueError, match="graph_upsample_ratio 2.5"):
        translate_ids(model, [too_long], "tgt2src")


def test_old_model_directories_without_head_fields_load_as_ctc(tmp_path):
    model = _initialized(0)
    spm_file = tmp_path / "fake.model"
    spm_file.write_bytes(b"x")
    directory = save_model_dir(tmp_path / "model", model, spm_file, "en", "de")
    meta = read_meta(directory)
    for key in ("head", "graph_upsample_ratio", "link_heads"):
        del meta["model"][key]
    (directory / CONFIG_FILE).write_text(json.dumps(meta), encoding="utf-8")
    loaded, _ = load_model_dir(directory)
    assert loaded.cfg == model.cfg and loaded.cfg.head == "ctc"


def test_saved_numbers_load_with_the_field_types_and_bad_ones_name_their_key(tmp_path):
    """config.json of a DAG model saved with ints where the fields are floats (as older code wrote them)."""
    model = tiny_model(head="dag", graph_upsample_ratio=8.0, link_heads=2, dropout=0.0).eval()
    spm_file = tmp_path / "fake.model"
    spm_file.write_bytes(b"x")
    directory = save_model_dir(tmp_path / "model", model, spm_file, "en", "de")
    meta = read_meta(directory)
    meta["model"].update(graph_upsample_ratio=8, dropout=0)
    (directory / CONFIG_FILE).write_text(json.dumps(meta), encoding="utf-8")
    assert '"graph_upsample_ratio": 8,' in (directory / CONFIG_FILE).read_text(encoding="utf-8")
    loaded, _ = load_model_dir(directory)
    assert loaded.cfg == model.cfg and isinstance(loaded.cfg.graph_upsample_ratio, float)
    meta["model"].update(link_heads="2")
    (directory / CONFIG_FILE).write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ValueError, match=r"model\.link_heads: expected int, got str '2'"):
        load_model_dir(directory)
    meta["model"] = {**model.cfg.to_dict(), "heads": 2}
    (directory / CONFIG_FILE).write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ValueError, match=r"model: unknown keys \['model\.heads'\]"):
        load_model_dir(directory)


def _teacher(seed: int = 0, vocab_size: int = 12) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(vocab_size=vocab_size, d_model=16, n_heads=2, ffn_dim=32, encoder_layers=2,
                                         decoder_layers=1, max_positions=64)).eval()


def test_transformer_model_directory_round_trip_translates_identically(tmp_path):
    teacher = _teacher()
    spm_file = tmp_path / "fake.model"
    spm_file.write_bytes(b"not read by the model")
    directory = save_model_dir(tmp_path / "teacher", teacher, spm_file, "en", "de", extra={"direction": "tgt2src"})
    loaded, meta = load_model_dir(directory)
    assert isinstance(loaded, Transformer) and not loaded.training and loaded.cfg == teacher.cfg
    assert meta["architecture"] == "transformer" and meta["direction"] == "tgt2src"
    assert read_meta(save_model_dir(tmp_path / "reder", _initialized(0), spm_file, "en", "de"))["architecture"] == "reder"
    tokens, lengths = random_batch([6, 4, 5], 12)
    for decoder, options in (("greedy", {}), ("beam", {"beam_size": 1}), ("beam", {"beam_size": 3})):
        assert (decode(loaded, tokens, lengths, "tgt2src", decoder, **options)
                == decode(teacher, tokens, lengths, "tgt2src", decoder, **options))
    sequences = [tokens[i, : lengths[i]].tolist() for i in range(3)]
    one_by_one = [decode(teacher, *pad_batch([s]), "tgt2src", "beam", beam_size=2)[0] for s in sequences]
    assert translate_ids(loaded, sequences, "tgt2src", "beam", batch_size=2, beam_size=2) == one_by_one
    with pytest.raises(ValueError, match="input 1: 65 pieces .* exceed the model's limit of 64 \\(max_positions 64\\)"):
        translate_ids(loaded, [[4] * 64 + [EOS_ID]], "tgt2src")


def test_load_teacher_dir_names_each_problem(tmp_path):
    spm_file = tmp_path / "fake.model"
    spm_file.write_bytes(b"x")
    teacher_dir = save_model_dir(tmp_path / "teacher", _teacher(), spm_file, "en", "de", extra={"direction": "src2tgt"})
    loaded = load_teacher_dir(teacher_dir, "src2tgt", vocab_size=12)
    assert isinstance(loaded, Transformer) and not loaded.training
    torch.testing.assert_close(loaded.embed.weight, _teacher().embed.weight)
    with pytest.raises(FileNotFoundError, match="teacher directory .*missing.* does not exist"):
        load_teacher_dir(tmp_path / "missing", "src2tgt", 12)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty is not a model directory"):
        load_teacher_dir(tmp_path / "empty", "src2tgt", 12)
    reder_dir = save_model_dir(tmp_path / "reder", _initialized(0), spm_file, "en", "de")
    with pytest.raises(ValueError, match="reder is not a teacher: its architecture is 'reder'"):
        load_teacher_dir(reder_dir, "src2tgt", 12)
    with pytest.raises(ValueError, match="the teacher translates 'src2tgt', but 'tgt2src' was asked for"):
        load_teacher_dir(teacher_dir, "tgt2src", 12)
    with pytest.raises(ValueError, match="vocabulary mismatch: teacher has 12 pieces, the run's SentencePiece model has 13"):
        load_teacher_dir(teacher_dir, "src2tgt", 13)


def _candidates(model, tokens, lengths, direction, beam_size):
    """The ids of the CTC n-best alone (best first, specials stripped, duplicates merged): what a reranker rescores."""
    return [[ids for ids, _ in entries] for entries in nbest(model, tokens, lengths, direction, beam_size)]


def test_candidates_are_the_stripped_deduplicated_ctc_nbest():
    model = _initialized(0)
    tokens, lengths = random_batch([7, 2, 5, 3], 12)
    log_probs, out_lengths = model(tokens, lengths, "src2tgt")
    candidates = _candidates(model, tokens, lengths, "src2tgt", 5)
    for row, entries in enumerate(ctc_nbest(log_probs, out_lengths, model.cfg.blank_id, 5)):
        expected = []
        for labels, _ in entries:
            stripped = strip_special(labels, model.cfg.blank_id)
            if stripped not in expected:
                expected.append(stripped)
        assert candidates[row] == expected
    assert [c[0] for c in candidates] == decode(model, tokens, lengths, "src2tgt", "beam", beam_size=5)
    with pytest.raises(ValueError, match="an n-best needs a CTC model; this model's head is 'dag'"):
        nbest(tiny_model(head="dag", graph_upsample_ratio=2.5, link_heads=2).eval(), tokens, lengths, "src2tgt", 5)


def test_translate_ids_with_a_teacher_reranks_the_ctc_candidates():
    model, teacher = _initialized(0), _teacher(1)
    tokens, lengths = random_batch([7, 2, 5, 3, 6], 12)
    sequences = [tokens[i, : lengths[i]].tolist() for i in range(5)]
    reranked = translate_ids(model, sequences, "tgt2src", "beam", batch_size=2, beam_size=4, rerank="teacher", teacher=teacher)
    manual = [rerank(teacher, *pad_batch([s]), _candidates(model, *pad_batch([s]), "tgt2src", 4))[0] for s in sequences]
    assert reranked == manual
    assert reranked != translate_ids(model, sequences, "tgt2src", "beam", beam_size=4)  # the teacher changed some choices
    # a teacher reranks the CTC beam only: greedy takes no reranker, a DAG's beam none either
    # (the exact list of options a decoder takes: tests/reder/test_decoding.py)
    with pytest.raises(ValueError, match=r"decoder 'greedy' of ctc: unknown options \['rerank', 'teacher'\]; "
                                         r"it takes \[.*'blank_penalty'\]$"):
        translate_ids(model, sequences, "tgt2src", rerank="teacher", teacher=teacher)
    dag = tiny_model(head="dag", graph_upsample_ratio=2.5, link_heads=2).eval()
    with pytest.raises(ValueError, match=r"decoder 'beam' of dag: unknown options \['rerank', 'teacher'\]"):
        translate_ids(dag, sequences, "tgt2src", "beam", beam_size=4, rerank="teacher", teacher=teacher)
    # the library does not imply rerank="teacher" from a teacher (the CLI does), nor the reverse
    with pytest.raises(ValueError, match="a teacher is only for rerank='teacher'"):
        translate_ids(model, sequences, "tgt2src", "beam", beam_size=4, teacher=teacher)
    with pytest.raises(ValueError, match="rerank='teacher' needs a teacher"):
        translate_ids(model, sequences, "tgt2src", "beam", beam_size=4, rerank="teacher")
    with pytest.raises(ValueError, match="input 1: 7 pieces .* exceed the teacher's limit of 6"):
        translate_ids(model, sequences, "tgt2src", "beam", beam_size=2, rerank="teacher",
                      teacher=Transformer(replace(teacher.cfg, max_positions=6)))


@pytest.fixture()
def spm_dir(tmp_path):
    """A real SentencePiece model of 29 pieces (the models add the blank: vocabulary 30)."""
    sentences = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song", "dogs and cats are friends"] * 20
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_prefix=str(tmp_path / "spm"),
                                             vocab_size=29, pad_id=PAD_ID, unk_id=1, bos_id=2, eos_id=EOS_ID,
                                             minloglevel=2, hard_vocab_limit=True)
    return tmp_path


def test_cli_reranks_with_a_teacher_and_decodes_with_a_transformer(spm_dir, monkeypatch, capsys):
    torch.manual_seed(0)
    model = tiny_model(vocab_size=30)
    src, src_lengths = random_batch([5, 3, 4], 30)
    DuplexLoss(model)(src, src_lengths, src, src_lengths, step=0)
    model.eval()
    spm_file = spm_dir / "spm.model"
    reder_dir = save_model_dir(spm_dir / "reder", model, spm_file, "en", "de")
    teacher = _teacher(2, vocab_size=30)
    teacher_dir = save_model_dir(spm_dir / "teacher", teacher, spm_file, "en", "de", extra={"direction": "src2tgt"})
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_file))
    lines = ["the cat sat", "a dog sang a song on the mat", "birds"]

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr("sys.stdin", io.StringIO("".join(line + "\n" for line in lines)))
        code = translate_main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = run("--checkpoint", str(reder_dir), "--direction", "src2tgt", "--beam", "3", "--teacher", str(teacher_dir))
    # --teacher alone implies --rerank teacher (the CLI's rule; the library asks for both)
    expected = translate_lines(model, sp, lines, "src2tgt", CtcBeam(beam_size=3, rerank="teacher", teacher=teacher))
    assert code == 0 and out.splitlines() == expected
    code, out, _ = run("--checkpoint", str(teacher_dir), "--direction", "src2tgt", "--beam", "2")
    assert code == 0 and out.splitlines() == translate_lines(teacher, sp, lines, "src2tgt", TeacherBeam(beam_size=2))
    code, out, _ = run("--checkpoint", str(reder_dir), "--direction", "src2tgt", "--beam", "3", "--rerank", "self",
                       "--rerank-weight", "2", "--cutoff-top-n", "5", "--cutoff-prob", "0.99")
    expected = translate_lines(model, sp, lines, "src2tgt", CtcBeam(beam_size=3, rerank="self", rerank_weight=2.0,
                                                                   cutoff_top_n=5, cutoff_prob=0.99))
    assert code == 0 and out.splitlines() == expected
    reder_args = ("--checkpoint", str(reder_dir), "--direction", "src2tgt", "--beam", "3")
    for args, message in [
        ((*reder_args, "--rerank", "teacher"), "error: --rerank teacher needs --teacher DIR\n"),
        ((*reder_args, "--rerank", "self", "--teacher", str(teacher_dir)), "--teacher DIR is the reranker of --rerank teacher"),
        ((*reder_args, "--rerank", "self", "--rerank-weight", "-1"),
         f"error: decoder 'beam': rerank_weight must be >= 0, got -1.0 (ctc model {reder_dir})\n"),
        # a reranker without a beam: greedy takes no --rerank (nor --teacher), and says what it takes (the exact
        # lists: tests/reder/test_decoding.py)
        ((*reder_args[:4], "--rerank", "self"),
         ("error: decoder 'greedy' of ctc: unknown options ['rerank']; it takes [", f"'blank_penalty'] (ctc model {reder_dir})\n")),
        (("--checkpoint", str(teacher_dir), "--direction", "src2tgt", "--rerank", "self"),
         ("error: decoder 'greedy' of transformer: unknown options ['rerank']; it takes [",
          f"'max_len_a', 'max_len_b'] (transformer model {teacher_dir})\n")),
        (("--checkpoint", str(teacher_dir), "--direction", "src2tgt", "--beam", "2", "--rerank", "self"),
         "error: decoder 'beam' of transformer: unknown options ['rerank']; it takes ["),
        (("--checkpoint", str(reder_dir), "--direction", "src2tgt", "--teacher", str(teacher_dir)),
         ("error: decoder 'greedy' of ctc: unknown options ['rerank', 'teacher']; it takes [", "'blank_penalty'] (ctc model")),
        (("--checkpoint", str(reder_dir), "--direction", "tgt2src", "--beam", "3", "--teacher", str(teacher_dir)),
         "the teacher translates 'src2tgt', but 'tgt2src'"),
        (("--checkpoint", str(reder_dir), "--direction", "src2tgt", "--beam", "3", "--teacher", str(spm_dir / "nope")), "does not exist"),
        (("--checkpoint", str(teacher_dir), "--direction", "tgt2src"), "is a Transformer for direction 'src2tgt', not 'tgt2src'"),
    ]:
        code, out, err = run(*args)
        fragments = (message,) if isinstance(message, str) else message
        assert code == 2 and out == "" and err.count("\n") == 1 and all(f in err for f in fragments), err
