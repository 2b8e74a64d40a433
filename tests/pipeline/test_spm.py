import json
import unicodedata

import pytest
import sentencepiece

from pipeline import graph, spm
from pipeline.config import load_config
from pipeline.stage import StageError
from reder.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from tests.pipeline.conftest import make_pairs, write_files_corpus

EXTRA = ["Ｆｕｌｌｗｉｄｔｈ  text   with   spaces.", "Ñandú, cigüeña y pingüino — «comillas».", "ﬁne ligature ①"]


def reference_normalise(text: str) -> str:
    """What nmt_nfkc does to ordinary text: NFKC, whitespace runs collapsed, ends stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


@pytest.fixture(scope="module")
def sentences():
    return [s for pair in make_pairs(400) for s in pair] + EXTRA * 3


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_special_ids_and_blank_last(sentences, model_type):
    proto = spm.train(sentences, 120, model_type)
    processor = spm.load(proto, 120)
    assert processor.get_piece_size() == 120
    assert (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id()) == (
        PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    assert processor.id_to_piece(119) == "<blank>" and processor.is_control(119)
    probes = sentences + ["<blank>", "a <blank> b", "<s> </s> <pad> <unk>", "\t<blank>\n"]
    produced = {i for ids in processor.encode(probes) for i in ids}
    assert 119 not in produced and PAD_ID not in produced and BOS_ID not in produced and EOS_ID not in produced
    assert max(produced) == 118  # the learned pieces fill every id below the blank


def test_decode_gives_back_the_normalised_text(sentences):
    processor = spm.load(spm.train(sentences, 150, "bpe"), 150)
    for text in sentences:
        ids = processor.encode(text)
        assert UNK_ID not in ids
        assert processor.decode(ids) == reference_normalise(text)


def test_vocab_too_large_for_the_corpus_is_a_clear_error():
    with pytest.raises(StageError, match="smaller model.vocab_size"):
        spm.train(["tiny corpus", "two lines"], 5000)


def test_load_rejects_a_model_without_the_project_layout(sentences, tmp_path):
    prefix = tmp_path / "plain"
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_prefix=str(prefix),
                                             vocab_size=100, minloglevel=2)  # unk 0, bos 1, eos 2
    with pytest.raises(StageError, match="expected"):
        spm.load(f"{prefix}.model")
    with pytest.raises(StageError, match="120 pieces"):
        spm.load(spm.train(sentences, 100), 120)


def test_stage_needs_ingest_and_writes_model_and_vocab(tmp_path):
    corpus = write_files_corpus(tmp_path / "corpus")
    cfg = load_config(None, ["data.source=files", f"data.local_dir={corpus}", "data.tgt_lang=de",
                             "model.vocab_size=100", "spm.sample_size=200"])
    with pytest.raises(StageError, match="stage 'ingest' has no finished output"):
        graph.run(cfg, tmp_path / "w", "spm")
    graph.run(cfg, tmp_path / "w", "ingest")
    out = graph.run(cfg, tmp_path / "w", "spm")
    processor = spm.load(out / "spm.model", 100)
    vocab = (out / "spm.vocab").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == 100 and vocab[0].startswith("<pad>\t") and vocab[-1].startswith("<blank>\t")
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert counts == {"sample_sentences": 200, "vocab_size": 100, "blank_id": 99}
    assert processor.encode("the dog") != []
    # the vocabulary size is part of the key: a different size is a different directory
    other = load_config(None, ["data.source=files", f"data.local_dir={corpus}", "data.tgt_lang=de",
                               "model.vocab_size=90", "spm.sample_size=200"])
    assert graph.output_dir(other, tmp_path / "w", "spm") != out
