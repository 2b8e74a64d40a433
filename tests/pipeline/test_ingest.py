import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline import graph, stagekeys
from pipeline.config import DataConfig, load_config
from pipeline.stages import ingest
from pipeline.stages.ingest import CorpusError, corpora
from pipeline.stages.ingest.readers import CHUNK, TextRules, read_parallel
from tests.conftest import SHARED_DATA
from tests.pipeline.conftest import make_pairs, needs_sword_bibles, write_files_corpus
from tests.pipeline.sword_module import write_ztext_module


def files_config(local_dir, *overrides):
    return load_config(None, ["data.source=files", f"data.local_dir={local_dir}", "data.src_lang=en",
                              "data.tgt_lang=de", *overrides])


def columns(part) -> tuple[list, list, list]:
    """ids, src and tgt of a RawSplit, read through (its rows are a stream)."""
    rows = list(part.rows)
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def assert_nothing_written(workdir: Path):
    leftovers = [p.name for p in workdir.iterdir() if not p.name.endswith(".lock")] if workdir.exists() else []
    assert leftovers == [], leftovers


def test_files_corpus_roundtrips_to_parquet(tmp_path):
    corpus = write_files_corpus(tmp_path / "corpus")
    out = graph.run(files_config(corpus), tmp_path / "work", "ingest")
    assert (out / "_SUCCESS").exists()
    train = pq.read_table(out / "train")
    assert train.schema.names == ["id", "src", "tgt"]
    assert str(train.schema.field("id").type) == "int64"
    lines_src = (corpus / "train.en").read_text(encoding="utf-8").splitlines()
    lines_tgt = (corpus / "train.de").read_text(encoding="utf-8").splitlines()
    for row in train.to_pylist():  # id is the 1-based line number in the source files
        assert (row["src"], row["tgt"]) == (lines_src[row["id"] - 1], lines_tgt[row["id"] - 1])
    report = json.loads((out / "report.json").read_text())
    assert report["splits"]["train"]["read"] == 300
    assert report["splits"]["train"]["kept"] + sum(report["splits"]["train"]["dropped"].values()) == 300
    assert pq.read_table(out / "valid").num_rows == 40


def test_misaligned_files_name_both_files_and_counts(tmp_path):
    corpus = write_files_corpus(tmp_path / "corpus")
    (corpus / "valid.de").write_text("eins\nzwei\n", encoding="utf-8")
    with pytest.raises(CorpusError) as error:
        graph.run(files_config(corpus), tmp_path / "work", "ingest")
    message = str(error.value)
    assert "misaligned" in message and str(corpus / "valid.en") in message and str(corpus / "valid.de") in message
    assert "40 lines" in message and "has 2" in message
    assert_nothing_written(tmp_path / "work")


def test_invalid_utf8_names_file_and_line(tmp_path):
    corpus = write_files_corpus(tmp_path / "corpus")
    lines = (corpus / "train.de").read_bytes().split(b"\n")
    lines[6] = b"kaputt \xff\xfe text"
    (corpus / "train.de").write_bytes(b"\n".join(lines))
    with pytest.raises(CorpusError, match=rf"{corpus / 'train.de'}:7: invalid UTF-8"):
        graph.run(files_config(corpus), tmp_path / "work", "ingest")
    assert_nothing_written(tmp_path / "work")
    out = graph.run(files_config(corpus, "data.lenient=true"), tmp_path / "work", "ingest")
    report = json.loads((out / "report.json").read_text())
    assert report["splits"]["train"]["dropped"]["invalid_utf8"] == 1
    assert 7 not in pq.read_table(out / "train").column("id").to_pylist()


def test_empty_corpus_is_an_error(tmp_path):
    corpus = write_files_corpus(tmp_path / "corpus")
    (corpus / "train.en").write_text("", encoding="utf-8")
    (corpus / "train.de").write_text("", encoding="utf-8")
    with pytest.raises(CorpusError, match="empty corpus: no train pairs"):
        graph.run(files_config(corpus), tmp_path / "work", "ingest")
    assert_nothing_written(tmp_path / "work")
    (corpus / "train.en").write_text("\n \n", encoding="utf-8")  # only empty lines: all dropped
    (corpus / "train.de").write_text("a\n\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"dropped \{'empty': 2\}"):
        graph.run(files_config(corpus), tmp_path / "work", "ingest")


def test_missing_file_is_a_clear_error(tmp_path):
    corpus = write_files_corpus(tmp_path / "corpus")
    (corpus / "test.de").unlink()
    with pytest.raises(CorpusError, match=rf"corpus file not found: {corpus / 'test.de'}"):
        graph.run(files_config(corpus), tmp_path / "work", "ingest")
    assert_nothing_written(tmp_path / "work")


def test_filters_drop_from_train_and_only_count_in_eval(tmp_path):
    corpus = write_files_corpus(tmp_path / "corpus", {"train": 5, "valid": 5, "test": 5})
    src = ["A dog runs.", "", "x" * 50, "Short.", "A dog runs.", "The cat sits."]
    tgt = ["Ein Hund läuft.", "Leer nicht.", "y" * 50, "Das ist ein sehr viel längerer Satz.",
           "Ein Hund läuft.", "Die Katze sitzt."]
    for split in ("train", "valid"):
        (corpus / f"{split}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        (corpus / f"{split}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    out = graph.run(files_config(corpus, "data.max_chars=40", "data.max_length_ratio=3"), tmp_path / "w", "ingest")
    report = json.loads((out / "report.json").read_text())["splits"]
    assert report["train"]["dropped"] == {"duplicate": 1, "empty": 1, "length_ratio": 1, "too_long": 1}
    assert pq.read_table(out / "train").column("id").to_pylist() == [1, 6]
    assert report["valid"]["flagged"] == {"duplicate": 1, "empty": 1, "length_ratio": 1, "too_long": 1}
    assert pq.read_table(out / "valid").num_rows == 6


def test_gzip_crlf_and_tsv_inputs(tmp_path):
    pairs = make_pairs(20)
    corpus = tmp_path / "gz"
    corpus.mkdir()
    for split in ingest.SPLITS:
        for side, lang in enumerate(("en", "de")):
            text = "".join(p[side] + "\r\n" for p in pairs).encode("utf-8")
            (corpus / f"{split}.{lang}.gz").write_bytes(gzip.compress(text))
    out = graph.run(files_config(corpus), tmp_path / "w1", "ingest")
    assert pq.read_table(out / "train").column("src").to_pylist() == [p[0] for p in pairs]

    tsv = tmp_path / "tsv"
    tsv.mkdir()
    for split in ingest.SPLITS:
        (tsv / f"{split}.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in pairs), encoding="utf-8")
    out = graph.run(load_config(None, ["data.source=tsv", f"data.local_dir={tsv}"]), tmp_path / "w2", "ingest")
    assert pq.read_table(out / "test").column("tgt").to_pylist() == [p[1] for p in pairs]
    (tsv / "valid.tsv").write_text("one\ttwo\nno tab here\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=rf"{tsv / 'valid.tsv'}:2: expected 2 tab-separated fields"):
        graph.run(load_config(None, ["data.source=tsv", f"data.local_dir={tsv}"]), tmp_path / "w3", "ingest")


def test_rerun_skips_and_changed_input_or_config_gets_a_new_directory(tmp_path):
    corpus = write_files_corpus(tmp_path / "corpus")
    first = graph.run(files_config(corpus), tmp_path / "w", "ingest")
    started = json.loads((first / "manifest.json").read_text())["started"]
    assert graph.run(files_config(corpus), tmp_path / "w", "ingest") == first
    assert json.loads((first / "manifest.json").read_text())["started"] == started
    assert graph.run(files_config(corpus, "data.max_chars=500"), tmp_path / "w", "ingest") != first
    with open(corpus / "test.de", "a", encoding="utf-8") as handle:
        handle.write("Ein neuer Satz.\n")
    with open(corpus / "test.en", "a", encoding="utf-8") as handle:
        handle.write("A new sentence.\n")
    assert graph.run(files_config(corpus), tmp_path / "w", "ingest") != first


@pytest.mark.parametrize("overrides, expected", [
    (["data.source=files", "data.local_dir=/nonexistent/duplex-corpus", "data.src_lang=en", "data.tgt_lang=de"],
     "ingest-9e3b9acf5782"),
    (["data.sword_path=/nonexistent/duplex-sword"], "ingest-4d0e390f92b1"),
    (["data.source=multi30k", "data.src_lang=en", "data.tgt_lang=fr", "data.local_dir=/nonexistent/duplex-corpus",
      "data.download=false", "data.cache_dir=/elsewhere", "data.test_split=test_2017_flickr"], "ingest-801f5e64e819"),
])
def test_output_dir_hash_is_stable(overrides, expected):
    """Values computed by the single-file pipeline/stages/ingest.py (before the package split): a change here
    renames every ingest directory and, through their keys, every directory downstream."""
    assert graph.output_dir(load_config(None, overrides), Path("/nonexistent/duplex-work"), "ingest") == \
        Path("/nonexistent/duplex-work") / expected


def test_input_files_are_identified_by_content_not_by_where_they_lie_or_their_mtime(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for corpus in (first, second):
        (corpus / "sub").mkdir(parents=True)  # directories are not inputs
        (corpus / "train.en").write_text("Hello.\n", encoding="utf-8")
    os.utime(second / "train.en", ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    sha = hashlib.sha256(b"Hello.\n").hexdigest()
    assert ingest.input_fingerprint(files_config(first).data) == {"train.en": sha}
    work = Path("/nonexistent/duplex-work")
    where = {corpus: graph.output_dir(files_config(corpus), work, "ingest") for corpus in (first, second)}
    assert where[first] == where[second]  # another checkout, or the directory `ray job submit` unpacks
    (second / "train.en").write_text("Hallo.\n", encoding="utf-8")  # same size, same mtime, new content
    os.utime(second / "train.en", ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    assert graph.output_dir(files_config(second), work, "ingest") != where[first]
    assert "local_dir" not in stagekeys.ingest_key(files_config(first))["data"]
    # No file to fingerprint (a corpus still to download): the directory's name stays in the key.
    assert stagekeys.ingest_key(files_config(tmp_path / "absent"))["data"]["local_dir"] == str(tmp_path / "absent")


def test_limit_keeps_the_first_lines(tmp_path):
    """data.limit=25 keeps exactly the first 25 lines of every split (ids 1-25, the files' own text), no other."""
    corpus = write_files_corpus(tmp_path / "corpus")  # 300/40/40 pairs, none that a filter drops
    out = graph.run(files_config(corpus, "data.limit=25", "data.dedupe=false"), tmp_path / "w", "ingest")
    for split in ("train", "valid", "test"):
        table = pq.read_table(out / split)
        assert table.column("id").to_pylist() == list(range(1, 26)), split
        for column, lang in (("src", "en"), ("tgt", "de")):
            assert table.column(column).to_pylist() == (corpus / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:25]


def test_named_corpus_download_path(tmp_path, monkeypatch):
    """The download branch on file:// URLs: fetched once into the cache, gunzipped, read."""
    remote = tmp_path / "remote"
    remote.mkdir()
    pairs = make_pairs(30)
    for stem in ("train", "val", "test_2016_flickr"):
        for side, lang in enumerate(("en", "de")):
            (remote / f"{stem}.{lang}.gz").write_bytes(gzip.compress("".join(p[side] + "\n" for p in pairs).encode()))
    url = remote.as_uri() + "/{stem}.{lang}.gz"
    corpus = ingest.NAMED["multi30k"]
    patched = ingest.NamedCorpus(corpus.languages, {
        name: ingest.SplitSource(src.stem, (ingest.Archive(url.replace("{stem}", src.stem)),))
        for name, src in corpus.splits.items()})
    monkeypatch.setitem(ingest.NAMED, "multi30k", patched)
    cfg = load_config(None, ["data.source=multi30k", "data.src_lang=en", "data.tgt_lang=de",
                             f"data.cache_dir={tmp_path / 'cache'}"])
    out = graph.run(cfg, tmp_path / "w", "ingest")
    assert pq.read_table(out / "valid").column("tgt").to_pylist() == [p[1] for p in pairs]
    assert (tmp_path / "cache" / "multi30k" / "val.de").is_file()
    with pytest.raises(CorpusError, match="is not in data.local_dir"):
        ingest.read_corpus(load_config(None, ["data.source=multi30k", "data.tgt_lang=de",
                                              "data.download=false"]).data, tmp_path)
    with pytest.raises(CorpusError, match="has languages"):
        ingest.read_corpus(load_config(None, ["data.source=multi30k", "data.tgt_lang=ro"]).data, tmp_path)


def test_downloaded_parts_are_streamed_into_the_cache_file_never_held_whole(tmp_path):
    """A split assembled from several downloads (a tar member of 12 MB whose last line has no newline, then a
    gzipped file) is copied chunk by chunk into a temporary file renamed into the cache: the bytes are the
    parts joined with a newline where one was missing, and the peak Python allocation stays near one chunk.
    A corrupt part leaves neither the cache file nor a temporary one behind."""
    import tracemalloc

    remote, cache = tmp_path / "remote", tmp_path / "cache"
    remote.mkdir()
    big = {lang: b"".join(b"%s line %08d of the first part\n" % (lang.encode(), i) for i in range(360_000))[:-1]
           for lang in ("en", "de")}
    small = {lang: f"{lang} second part\n".encode() for lang in ("en", "de")}
    with tarfile.open(remote / "first.tar", "w") as tar:
        for lang, blob in big.items():
            info = tarfile.TarInfo(f"corpus/first.{lang}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    for lang, blob in small.items():
        (remote / f"second.{lang}.gz").write_bytes(gzip.compress(blob))
    source = ingest.SplitSource("train", (ingest.Archive((remote / "first.tar").as_uri(), "corpus/first.{lang}"),
                                          ingest.Archive(remote.as_uri() + "/second.{lang}.gz")))
    data = load_config(None, ["data.source=multi30k", "data.src_lang=en", "data.tgt_lang=de"]).data
    tracemalloc.start()
    try:
        paths = corpora._fetch(data, source, cache, "train")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert all(len(blob) > 12_000_000 for blob in big.values())
    assert peak < 4 * CHUNK, peak
    assert [p.read_bytes() for p in paths] == [big[lang] + b"\n" + small[lang] for lang in ("en", "de")]
    assert not list(cache.glob(".*.part"))

    (remote / "second.de.gz").write_bytes(gzip.compress(small["de"])[:-12])  # truncated
    for path in paths:
        path.unlink()
    (cache / "second.de.gz").unlink()
    with pytest.raises(CorpusError, match="second.de.gz: corrupt gzip data"):
        corpora._fetch(data, source, cache, "train")
    assert (cache / "train.en").is_file() and not (cache / "train.de").exists()
    assert not list(cache.glob(".*.part"))


def test_iwslt14_preparation_follows_fairseq_split(tmp_path):
    lines = {lang: [f"{lang} sentence {i}" for i in range(1, 47)] for lang in ("de", "en")}
    archive = tmp_path / "de-en.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        def add(name, text):
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"de-en/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for lang, body in lines.items():
            add(f"train.tags.de-en.{lang}", "<url>http://x</url>\n<talkid>1</talkid>\n" + "\n".join(body) + "\n")
            for name in corpora._IWSLT_TEST:
                add(f"{name}.de-en.{lang}.xml", f'<doc><seg id="1"> {name} {lang} </seg>\n<seg id="2">b</seg></doc>')
    got = corpora._prepare_iwslt14(archive, tmp_path, "valid", ("de", "en"), DataConfig.max_input_mb)
    assert got[0].read_text().splitlines() == ["de sentence 23", "de sentence 46"]
    train = (tmp_path / "train.en").read_text().splitlines()
    assert len(train) == 44 and "en sentence 23" not in train and train[0] == "en sentence 1"
    test = (tmp_path / "test.de").read_text().splitlines()
    assert len(test) == 10 and test[0] == "IWSLT14.TED.dev2010 de"


@pytest.mark.skipif(not (SHARED_DATA / "multi30k" / "train.en").is_file(), reason="needs ../shared/data/multi30k")
def test_multi30k_loader_on_the_shared_copy(tmp_path):
    cfg = load_config(None, ["data.source=multi30k", "data.src_lang=en", "data.tgt_lang=fr",
                             f"data.local_dir={SHARED_DATA / 'multi30k'}", "data.download=false"])
    raw, _ = ingest.read_corpus(cfg.data, tmp_path)
    read = {split: columns(part) for split, part in raw.items()}
    assert {split: len(ids) for split, (ids, _, _) in read.items()} == {"train": 29000, "valid": 1014, "test": 1000}
    first_en = (SHARED_DATA / "multi30k" / "val.en").read_text(encoding="utf-8").split("\n")[0]
    first_fr = (SHARED_DATA / "multi30k" / "val.fr").read_text(encoding="utf-8").split("\n")[0]
    assert (read["valid"][1][0], read["valid"][2][0]) == (first_en, first_fr)
    cfg2 = load_config(None, ["data.source=multi30k", "data.tgt_lang=de", "data.test_split=test_2017_flickr",
                              f"data.local_dir={SHARED_DATA / 'multi30k'}", "data.download=false"])
    raw2, _ = ingest.read_corpus(cfg2.data, tmp_path)
    assert raw2["test"].origin.endswith("test_2017_flickr.de")


def test_clean_osis_keeps_words_apart_and_drops_notes():
    raw = ('<w lemma="strong:H0430">God</w><note placement="foot">The Hebrew word “God”.</note>'
           '<w lemma="strong:H1254">created</w> <w>the</w> <w>heavens</w>&amp; '
           '<title type="psalm">A Psalm.</title> <note>x</note>, end.')
    assert ingest.clean_osis(raw) == "God created the heavens& A Psalm. , end."


def _tiny_sword(tmp_path):
    library = tmp_path / "sword"
    verses_en = {("Gen", 1, v): f'<w lemma="x">Verse</w><note>n</note><w>{v}</w> of Genesis.' for v in range(1, 21)}
    verses_es = {("Gen", 1, v): f"Versículo {v} de Génesis." for v in range(1, 21)}
    verses_en[("Gen", 1, 5)] = ""  # a verse one module omits: not a pair
    verses_en[("Exod", 2, 3)] = "Exodus two three."
    verses_es[("Exod", 2, 3)] = "Éxodo dos tres."
    write_ztext_module(library, "TinyEn", verses_en, "en")
    write_ztext_module(library, "TinyEs", verses_es, "es")
    return library


def test_sword_reader_on_a_module_built_here(tmp_path):
    library = _tiny_sword(tmp_path)
    cfg = load_config(None, [f"data.sword_path={library}", "data.sword_src_module=TinyEn",
                             "data.sword_tgt_module=TinyEs", "data.valid_size=3", "data.test_size=4"])
    raw, notes = ingest.read_sword(cfg.data)
    raw = {split: columns(part) for split, part in raw.items()}
    assert {split: len(ids) for split, (ids, _, _) in raw.items()} == {"train": 13, "valid": 3, "test": 4}
    all_ids = sorted(i for ids, _, _ in raw.values() for i in ids)
    assert len(set(all_ids)) == 20
    by_text = {s: t for _, src, tgt in raw.values() for s, t in zip(src, tgt)}
    assert by_text["Verse 7 of Genesis."] == "Versículo 7 de Génesis."
    assert by_text["Exodus two three."] == "Éxodo dos tres."
    assert "Verse 5 of Genesis." not in by_text and notes["sword_empty_verses"] == notes["sword_verses"] - 20
    again, _ = ingest.read_sword(cfg.data)  # deterministic split
    assert {s: columns(p)[0] for s, p in again.items()} == {s: ids for s, (ids, _, _) in raw.items()}
    other, _ = ingest.read_sword(load_config(None, [f"data.sword_path={library}", "data.sword_src_module=TinyEn",
                                                    "data.sword_tgt_module=TinyEs", "data.valid_size=3",
                                                    "data.test_size=4", "data.split_seed=2"]).data)
    assert columns(other["test"])[0] != raw["test"][0]


def test_sword_stage_key_covers_the_modules_files_and_nothing_else_of_the_library(tmp_path):
    """The key of a `sword` ingest is what pysword reads: both modules' conf files and the files of their
    DataPath directories, by content; other files and modules of the library change nothing."""
    library = _tiny_sword(tmp_path)
    cfg = load_config(None, [f"data.sword_path={library}", "data.sword_src_module=TinyEn",
                             "data.sword_tgt_module=TinyEs"])
    first = stagekeys.ingest_key(cfg)
    module_dir = library / "modules" / "texts" / "ztext"
    assert sorted(first["files"]) == sorted(
        [str(library / "mods.d" / f"{name}.conf") for name in ("tinyen", "tinyes")]
        + [str(module_dir / name / part) for name in ("tinyen", "tinyes") for part in ("ot.bzs", "ot.bzv", "ot.bzz")])
    (library / "README").write_text("notes\n", encoding="utf-8")
    (module_dir / "tinyen" / ".." / "README").write_text("notes\n", encoding="utf-8")
    write_ztext_module(library, "Other", {("Gen", 1, 1): "Other."})
    assert stagekeys.ingest_key(cfg) == first
    shutil.rmtree(module_dir / "tinyes")
    (library / "mods.d" / "tinyes.conf").unlink()
    write_ztext_module(library, "TinyEs", {("Gen", 1, v): f"Versículo {v}." for v in range(1, 21)}, "es")
    edited = stagekeys.ingest_key(cfg)
    changed = {path for path in first["files"] if edited["files"][path] != first["files"][path]}
    assert changed == {str(module_dir / "tinyes" / part) for part in ("ot.bzs", "ot.bzv", "ot.bzz")}
    (module_dir / "tinyen" / "ot.bzz").unlink()
    assert stagekeys.ingest_key(cfg)["files"].get(str(module_dir / "tinyen" / "ot.bzz")) is None


def test_missing_sword_modules_say_how_to_install(tmp_path):
    cfg = load_config(None, [f"data.sword_path={tmp_path / 'none'}"])
    with pytest.raises(CorpusError, match="apt-get install -y sword-text-web sword-text-sparv"):
        graph.run(cfg, tmp_path / "w", "ingest")
    assert_nothing_written(tmp_path / "w")


@needs_sword_bibles
def test_sword_reader_on_the_debian_bible_pair(tmp_path):
    cfg = load_config(None)
    raw, notes = ingest.read_sword(cfg.data)
    read = {split: columns(part) for split, part in raw.items()}
    sizes = {split: len(ids) for split, (ids, _, _) in read.items()}
    assert sizes["valid"] == 1000 and sizes["test"] == 1000 and 28000 < sizes["train"] < 31000
    assert notes["sword_verses"] > 31000
    by_id = {i: (s, t) for ids, src, tgt in read.values() for i, s, t in zip(ids, src, tgt)}
    assert by_id[1] == ("In the beginning, God created the heavens and the earth.",  # Gen 1:1
                        "EN el principio crió Dios los cielos y la tierra.")
    assert all(s and t for s, t in by_id.values())


@pytest.mark.parametrize("damage", ["truncated", "invalid deflate block", "bad header"])
def test_corrupt_gzip_names_file_and_line(tmp_path, damage):
    corpus = write_files_corpus(tmp_path / "corpus")
    text = (corpus / "train.de").read_bytes()
    (corpus / "train.de").unlink()
    packed = gzip.compress(text)
    packed = {"truncated": packed[: len(packed) // 2],  # EOFError
              "invalid deflate block": packed[:10] + b"\xff" * 20 + packed[30:],  # zlib.error
              "bad header": packed[:2] + b"\x07" + packed[3:]}[damage]  # gzip.BadGzipFile
    (corpus / "train.de.gz").write_bytes(packed)
    with pytest.raises(CorpusError, match=rf"^{corpus / 'train.de.gz'}:\d+: corrupt gzip file \(.+\), after \d+ "
                                          r"complete lines; fetch or compress the file again$"):
        graph.run(files_config(corpus), tmp_path / "work", "ingest")
    assert_nothing_written(tmp_path / "work")


def test_max_input_mb_caps_the_decompressed_bytes_of_a_file(tmp_path, monkeypatch):
    """A decompression bomb stops at the cap: the reader reads chunk by chunk, never the whole file."""
    corpus = write_files_corpus(tmp_path / "corpus")
    (corpus / "valid.en").unlink()
    (corpus / "valid.en.gz").write_bytes(gzip.compress(b"Hello.\n" * 300_000))  # 2.1 MB from ~4 kB
    reads = []
    real_open = gzip.GzipFile

    def counting_open(*args, **kwargs):
        handle = real_open(*args, **kwargs)
        read = handle.read
        handle.read = lambda size=-1: reads.append(size) or read(size)
        return handle

    monkeypatch.setattr(gzip, "GzipFile", counting_open)
    with pytest.raises(CorpusError, match=rf"^{corpus / 'valid.en.gz'}: more than data.max_input_mb=1 MB once "
                                          r"decompressed; .* raise data.max_input_mb"):
        graph.run(files_config(corpus, "data.max_input_mb=1"), tmp_path / "work", "ingest")
    assert reads and set(reads) == {CHUNK} and sum(reads) < 2_100_000  # stopped before reading it all
    assert_nothing_written(tmp_path / "work")
    plain = tmp_path / "plain.en"
    plain.write_bytes(b"x\n" * 600_000)
    with pytest.raises(CorpusError, match=rf"^{plain}: more than data.max_input_mb=1 MB; "):
        columns(read_parallel(plain, plain, TextRules(max_input_mb=1)))
    bomb = corpus / "valid.en.gz"
    assert columns(read_parallel(bomb, bomb))[1] == ["Hello."] * 300_000  # under the default cap


def test_nul_bytes_are_an_error_or_replaced_and_very_long_lines_are_read_and_filtered(tmp_path):
    corpus = write_files_corpus(tmp_path / "corpus")
    for split in ("train", "valid"):
        lines = (corpus / f"{split}.en").read_bytes().split(b"\n")
        lines[0], lines[1] = lines[0].replace(b" ", b" \x00 ", 1), b"long " * 200_000
        (corpus / f"{split}.en").write_bytes(b"\n".join(lines))
    with pytest.raises(CorpusError, match=rf"^{corpus / 'train.en'}:1: U\+0000 \(NUL\) at character \d+: a control"):
        graph.run(files_config(corpus), tmp_path / "work", "ingest")
    assert_nothing_written(tmp_path / "work")
    out = graph.run(files_config(corpus, "data.bad_characters=replace"), tmp_path / "work", "ingest")
    report = json.loads((out / "report.json").read_text())
    train = pq.read_table(out / "train").to_pylist()
    assert ["\x00" in row["src"] for row in train if row["id"] == 1] == [False]  # a space now, counted:
    assert report["splits"]["train"]["text"] == {"replaced U+0000": 1}
    assert 2 not in {row["id"] for row in train} and report["splits"]["train"]["dropped"]["too_long"] >= 1
    assert len(pq.read_table(out / "valid").column("src")[1].as_py()) == 999_999  # stripped; counted, never dropped


def test_archive_members_and_downloaded_files_are_capped_too(tmp_path):
    """A named corpus's archive members (iwslt14, WMT) and downloaded .gz files are read under the same cap:
    a gzipped member that inflates beyond it, in a tar and in a zip, stops there with the member named."""
    import zipfile

    bomb = gzip.compress(b"Ein Hund.\n" * 150_000)  # 1.5 MB from a few kB
    tar_path = tmp_path / "corpus.tgz"
    with tarfile.open(tar_path, "w:gz") as tar:
        info = tarfile.TarInfo("de-en/train.de.gz")
        info.size = len(bomb)
        tar.addfile(info, io.BytesIO(bomb))
    zip_path = tmp_path / "corpus.zip"
    with zipfile.ZipFile(zip_path, "w") as archive:
        archive.writestr("train.de.gz", bomb)
    for archive, member in [(tar_path, "de-en/train.de.gz"), (zip_path, "train.de.gz")]:
        with pytest.raises(CorpusError, match=rf"^{archive}:{member}: more than data.max_input_mb=1 MB once decompressed"):
            corpora._member(archive, member, 1)
        assert corpora._member(archive, member, 2) == b"Ein Hund.\n" * 150_000
    with pytest.raises(CorpusError, match=rf"^{zip_path}:train.de.gz: corrupt gzip data"):
        with zipfile.ZipFile(zip_path, "w") as archive:
            archive.writestr("train.de.gz", bomb[:40] + b"\x00" * 40 + bomb[80:])
        corpora._member(zip_path, "train.de.gz", 2)


def test_sword_text_is_capped_too(tmp_path):
    """2 × 1.2 MB of verse text (from two small compressed modules): refused under a 1 MB cap, read under 3 MB."""
    library = tmp_path / "sword"
    verses = {("Genesis", 1, verse): "Verse " * 10_000 for verse in range(1, 21)}
    for name in ("BigEn", "BigEs"):
        write_ztext_module(library, name, verses)
    settings = [f"data.sword_path={library}", "data.sword_src_module=BigEn", "data.sword_tgt_module=BigEs",
                "data.valid_size=1", "data.test_size=1"]
    with pytest.raises(CorpusError, match=rf"^SWORD modules BigEn and BigEs in {library}: more than "
                                          r"data.max_input_mb=1 MB once decompressed"):
        ingest.read_sword(load_config(None, [*settings, "data.max_input_mb=1"]).data)
    raw, _ = ingest.read_sword(load_config(None, [*settings, "data.max_input_mb=3"]).data)
    assert sum(len(columns(part)[0]) for part in raw.values()) == 20
