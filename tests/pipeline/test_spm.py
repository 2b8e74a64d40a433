import json
import random
import tracemalloc
import unicodedata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sentencepiece

from pipeline import graph, parquet
from pipeline.config import load_config
from pipeline.stage import StageError
from pipeline.stages import spm
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


def pooled_sample(train_dir, size, seed):
    """The sample as it was once drawn (the whole split pooled into Python strings): the reference."""
    table = pq.read_table(train_dir, columns=["src", "tgt"])
    sentences = table.column("src").to_pylist() + table.column("tgt").to_pylist()
    if len(sentences) > size:
        sentences = random.Random(seed).sample(sentences, size)
    return sentences


def write_train(directory, rows):
    """A train split of `rows` pairs in ingest's layout (several part files), distinct sentences on each side."""
    table = pa.table({"id": pa.array(range(rows), pa.int64()),
                      "src": [f"source sentence {i} " + "x" * (i % 37) for i in range(rows)],
                      "tgt": [f"Zielsatz {i} " + "y" * (i % 41) for i in range(rows)]})
    parquet.write_split(table, directory)
    return directory


@pytest.mark.parametrize("size, seed", [(500, 0), (2000, 7), (2 * parquet.ROWS_PER_FILE + 400, 3), (10**6, 1)])
def test_training_sample_is_the_pooled_sample_drawn_as_a_stream(tmp_path, monkeypatch, size, seed):
    """The same sentences in the same order as sampling the pooled list (so the same model, the same stage
    directory), across part files and record batches, also when every sentence is taken (n <= size)."""
    train = write_train(tmp_path / "train", parquet.ROWS_PER_FILE + 700)
    monkeypatch.setattr(spm, "SAMPLE_BATCH_ROWS", 1000)  # several batches per file
    sample = spm.training_sample(train, size, seed)
    assert sample == pooled_sample(train, size, seed)
    assert len(sample) == min(size, 2 * (parquet.ROWS_PER_FILE + 700))


def _python_peak(function, *args):
    tracemalloc.start()
    try:
        function(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_training_sample_memory_does_not_grow_with_the_corpus(tmp_path):
    """A corpus 10x larger, the same sample size: the Python memory peak stays put (the pooled reference's
    grows with the corpus, by the 10x of its strings); Arrow holds one record batch of one column at a time."""
    small, large = write_train(tmp_path / "small", 2_000), write_train(tmp_path / "large", 20_000)
    corpora = (("small", small), ("large", large))
    peaks = {name: _python_peak(spm.training_sample, path, 100, 0) for name, path in corpora}
    assert peaks["large"] < 1.5 * peaks["small"] + 200_000, peaks
    reference = {name: _python_peak(pooled_sample, path, 100, 0) for name, path in corpora}
    assert reference["large"] > 5 * reference["small"], reference  # the check can see a corpus held whole
