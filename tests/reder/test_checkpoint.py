"""Model directories, checkpoint averaging and batched translation."""
import json

import pytest
import torch

from reder import EOS_ID
from reder.checkpoint import CONFIG_FILE, MODEL_FILE, average_state_dicts, load_model_dir, read_meta, save_model_dir
from reder.translate import pad_batch, translate_ids
from tests.reder.helpers import random_batch, tiny_model


def _initialized(seed: int):
    torch.manual_seed(seed)
    model = tiny_model()
    src, src_lengths = random_batch([5, 3, 4], 12)
    tgt, tgt_lengths = random_batch([4, 4, 2], 12)
    model.loss(src, src_lengths, tgt, tgt_lengths, step=0)  # data-initialises the ActNorms
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
    one_by_one = [model.translate(*pad_batch([s]), "src2tgt")[0] for s in sequences]
    assert translate_ids(model, sequences, "src2tgt", batch_size=2) == one_by_one
    too_long = [4] * (model.cfg.max_positions // model.cfg.upsample_ratio) + [EOS_ID]
    with pytest.raises(ValueError, match="input 2: 33 pieces"):
        translate_ids(model, [sequences[0], too_long], "tgt2src")


def test_dag_model_directory_round_trips_the_head_fields_and_decodes_identically(tmp_path):
    model = tiny_model(head="dag", graph_upsample_ratio=2.5, link_heads=2)
    src, src_lengths = random_batch([5, 3, 4], 12)
    tgt, tgt_lengths = random_batch([4, 4, 2], 12)
    model.loss(src, src_lengths, tgt, tgt_lengths, step=0)
    model.eval()
    spm_file = tmp_path / "fake.model"
    spm_file.write_bytes(b"not read by the model")
    loaded, meta = load_model_dir(save_model_dir(tmp_path / "model", model, spm_file, "en", "de"))
    assert meta["model"]["head"] == "dag" and meta["model"]["graph_upsample_ratio"] == 2.5 and meta["model"]["link_heads"] == 2
    assert loaded.cfg == model.cfg
    assert torch.equal(loaded.links["src"].query.weight, model.links["src"].query.weight)
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
