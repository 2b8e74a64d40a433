"""Ingest on inputs that are not what they look like, by family (line endings and invisible characters,
ambiguous files, unread files), and the streamed ingest against the bytes today's code wrote."""
from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline import graph
from pipeline.config import load_config
from pipeline.stages import ingest
from pipeline.stages.ingest import CorpusError
from pipeline.stages.ingest import filters
from pipeline.stages.ingest.filters import BLOOM_BITS, BLOOM_HASHES, DIGEST, SeenPairs, _Bloom, pair_digest
from pipeline.stages.ingest.stage import _build
from tests.conftest import SHARED_DATA
from tests.pipeline.conftest import SWORD_BIBLES, write_files_corpus

REPO = Path(__file__).resolve().parents[2]
BIBLE = REPO / "tests" / "data" / "bible_en_es"
REFERENCE = json.loads((REPO / "tests" / "data" / "ingest_reference.json").read_text(encoding="utf-8"))


def files_config(local_dir: Path, *overrides: str):
    return load_config(None, ["data.source=files", f"data.local_dir={local_dir}", "data.src_lang=en",
                              "data.tgt_lang=de", *overrides])


def synthetic_corpus(directory: Path) -> Path:
    """A `files` corpus that every filter touches: duplicates, empty sides, over-long and lopsided lines, CRLF
    endings, a gzipped side, an undecodable line (lenient mode), and a train split of several part files."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, size in (("train", 9000), ("valid", 300), ("test", 300)):
        src, tgt = [], []
        for i in range(1, size + 1):
            a, b = f"sentence {i % 7000} of {split} with some words", f"Satz {i % 7000} aus {split} mit Wörtern"
            if i % 97 == 0:
                a = ""
            if i % 89 == 0:
                b = "x" * 1200
            if i % 83 == 0:
                a = "kurz"
            if i % 71 == 0:
                a, b = f"  padded {i}\t", f"\tgepolstert {i}  "
            src.append(a.encode())
            tgt.append(b"\xff broken" if i == 500 else b.encode())
        ending = b"\r\n" if split == "valid" else b"\n"
        (directory / f"{split}.en").write_bytes(b"".join(line + ending for line in src))
        blob = b"".join(line + ending for line in tgt)
        if split == "train":
            (directory / "train.de.gz").write_bytes(gzip.compress(blob, mtime=0))
        else:
            (directory / f"{split}.de").write_bytes(blob)
    return directory


def _bible_tsv(directory: Path) -> Path:
    directory.mkdir()
    for split in ingest.SPLITS:
        en = (BIBLE / f"{split}.en").read_text(encoding="utf-8").split("\n")
        es = (BIBLE / f"{split}.es").read_text(encoding="utf-8").split("\n")
        (directory / f"{split}.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in zip(en, es) if a or b), encoding="utf-8")
    return directory


def _case(name: str, tmp_path: Path) -> list[str]:
    bible = ["data.source=files", f"data.local_dir={BIBLE}", "data.src_lang=en", "data.tgt_lang=es"]
    synthetic = lambda: ["data.source=files", f"data.local_dir={synthetic_corpus(tmp_path / 'synthetic')}",  # noqa: E731
                         "data.src_lang=en", "data.tgt_lang=de", "data.lenient=true"]
    return {"bible": lambda: bible,
            "bible_limit": lambda: bible + ["data.limit=50", "data.dedupe=false"],
            "bible_tsv": lambda: ["data.source=tsv", f"data.local_dir={_bible_tsv(tmp_path / 'tsv')}",
                                  "data.src_lang=en", "data.tgt_lang=es"],
            "synthetic": lambda: synthetic() + ["data.max_chars=1000"],
            "synthetic_nodedupe": lambda: synthetic() + ["data.dedupe=false", "data.limit=5000"],
            "multi30k": lambda: ["data.source=multi30k", f"data.local_dir={SHARED_DATA / 'multi30k'}",
                                 "data.src_lang=en", "data.tgt_lang=de", "data.download=false"],
            "sword": lambda: ["data.source=sword"]}[name]()


def _assert_todays_bytes(name: str, tmp_path: Path) -> Path:
    """Ingest case `name` into tmp_path/out and check every Parquet file and the split counts against
    ingest_reference.json; returns the output directory."""
    out = tmp_path / "out"
    out.mkdir()
    splits = _build(load_config(None, _case(name, tmp_path)).data, tmp_path / "work", out)
    parts = {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*.parquet"))}
    assert parts == REFERENCE[name]["parts"]
    assert splits == REFERENCE[name]["splits"]
    return out


@pytest.mark.parametrize("name", [name for name in REFERENCE if name != "_"])
def test_streamed_ingest_writes_todays_bytes(tmp_path, name):
    """Every Parquet file byte for byte as the in-memory ingest wrote it (ingest_reference.json, pinned from the
    code before the streamed ingest), on the shipped corpora and on one every filter, gzip, CRLF and lenient touch."""
    if name == "multi30k" and not (SHARED_DATA / "multi30k" / "train.en").is_file():
        pytest.skip("needs ../shared/data/multi30k")
    if name == "sword" and not SWORD_BIBLES:
        pytest.skip("needs the Debian SWORD packages")
    _assert_todays_bytes(name, tmp_path)


@pytest.mark.parametrize("name", ["synthetic", "multi30k"])
def test_spilled_de_duplication_writes_todays_bytes(tmp_path, monkeypatch, name):
    """The same files when the digests go to disk every 1,000 (batches of 500 rows; blocks of 16 behind a Bloom
    filter of 2 bits per digest, so many lookups read the disk); the spill file leaves nothing in the stage's
    directory."""
    if name == "multi30k" and not (SHARED_DATA / "multi30k" / "train.en").is_file():
        pytest.skip("needs ../shared/data/multi30k")

    class Small(filters.SeenPairs):
        spills = 0

        def __init__(self, spill_dir: Path) -> None:
            super().__init__(spill_dir, in_memory=1000, block=16, bloom_bits=2)

        def _spill(self) -> None:
            Small.spills += 1
            super()._spill()

    monkeypatch.setattr(filters, "SeenPairs", Small)
    monkeypatch.setattr(filters, "BATCH", 500)
    out = _assert_todays_bytes(name, tmp_path)
    assert Small.spills >= 5 and sorted(p.name for p in out.iterdir()) == ["report.json", "test", "train", "valid"]


@pytest.mark.parametrize("in_memory, block, bloom_bits", [
    (1 << 21, 512, 12),  # the defaults: nothing spilled
    (64, 4, 2),  # spilled often; a weak Bloom filter, so many lookups read the disk
    (1, 1, 12),  # every call's digests spilled; blocks of one digest
    (300, 512, 12),  # spilled runs smaller than a block
])
def test_seen_pairs_is_a_set_in_order(tmp_path, in_memory, block, bloom_bits):
    """Against a Python set, fed in batches: the first of equal digests is new, later ones (in and across
    batches) are not, whether the earlier one is in memory or spilled (run and block edges, all-zero and all-0xff
    bytes, and digests equal in 8 of their 16 bytes, as 8-byte digests of different pairs once were, included);
    runs in memory stay few, and the spill file goes with `close`."""
    rng = np.random.default_rng(0)
    edges = [bytes(16), bytes(15) + b"\x01", b"\x01" + bytes(15), b"\xff" * 16, b"\xff" * 8 + bytes(8),
             b"\x07" * 8 + b"\x09" * 8, b"\x08" * 8 + b"\x09" * 8]
    twins = [b"\x09" * 8 + bytes([i]) * 8 for i in range(40)]  # equal first halves: across blocks and runs
    pool = np.frombuffer(rng.bytes(16 * 3000) + b"".join(edges + twins), dtype=DIGEST)
    reference: set[bytes] = set()
    with SeenPairs(tmp_path, in_memory, block, bloom_bits) as seen:
        for size in [0, 1, 5, 100, 1000, 37, 4000, 2] * 8:
            digests = rng.choice(pool, size)
            expected = []
            for value in [digests.tobytes()[i:i + 16] for i in range(0, 16 * len(digests), 16)]:
                expected.append(value not in reference)
                reference.add(value)
            assert seen.first_seen(digests).tolist() == expected
        assert len(seen.runs) <= 12
        assert sum(map(len, seen.runs)) + sum(run.size for run in seen.spilled) == len(reference)
        assert (len(seen.spilled) > 0) == (in_memory < len(reference))
        assert seen.first_seen(pool).tolist() == [False] * len(pool)
    assert seen.file is None and list(tmp_path.iterdir()) == []


def test_de_duplication_tells_apart_pairs_whose_sides_join_to_the_same_text():
    """The digest was of `src\\ttgt`, so ("a\\tb", "c") repeated ("a", "b\\tc"), and only 8 bytes long. Now
    16 bytes of (source length, source, target): only a true repeat is flagged."""
    pairs = [(0, "a\tb", "c"), (1, "a", "b\tc"), (2, "a\t", "b\tc"), (3, "a", "b\tc"), (4, "ab", "c"), (5, "a", "bc")]
    flags = [""] * len(pairs)
    with SeenPairs() as seen:
        filters._flag_repeats(pairs, flags, seen)
    assert flags == ["", "", "", "duplicate", "", ""]
    assert len(pair_digest("a", "b")) == DIGEST.itemsize == 16


def test_the_bloom_filter_has_no_false_negatives_and_its_expected_false_positive_rate():
    """(1 - e^(-k n / m))^k for k hashes, n digests and m bits: 0.32 % at 12 bits and 8 hashes per digest."""
    rng = np.random.default_rng(1)
    members, others = rng.integers(0, 2**64 - 1, (2, 200_000), dtype=np.uint64, endpoint=True)
    bloom = _Bloom(members, BLOOM_BITS)
    assert bloom.might_contain(members).all()
    expected = (1 - np.exp(-BLOOM_HASHES / BLOOM_BITS)) ** BLOOM_HASHES
    assert abs(bloom.might_contain(others).mean() - expected) < 0.25 * expected


# --- line endings and invisible characters: an error naming file, line and character, or replaced and counted

BAD_TEXT = {
    "CR-only endings, one side": ("test.en", lambda lines: b"\r".join(lines) + b"\r", 1, "U+000D (CARRIAGE RETURN)"),
    "CR inside a CRLF line": ("train.de", lambda lines: b"".join(l + (b"\r\r\n" if i == 4 else b"\r\n") for i, l in enumerate(lines)), 5, "U+000D"),
    "NUL in a line": ("train.en", lambda lines: b"".join(l + (b" \x00x\n" if i == 4 else b"\n") for i, l in enumerate(lines)), 5, "U+0000 (NUL)"),
    "LINE SEPARATOR": ("valid.de", lambda lines: b"".join(l + ("\u2028".encode() if i == 2 else b"") + b"\n" for i, l in enumerate(lines)), 3, "U+2028 (LINE SEPARATOR)"),
    "PARAGRAPH SEPARATOR": ("valid.en", lambda lines: b"".join(l + ("\u2029x".encode() if i == 9 else b"") + b"\n" for i, l in enumerate(lines)), 10, "U+2029"),
    "NEL": ("test.de", lambda lines: b"".join(l + ("\u0085".encode() if i == 0 else b"") + b"\n" for i, l in enumerate(lines)), 1, "U+0085 (NEXT LINE)"),
    "vertical tab": ("train.en", lambda lines: b"".join(l + (b"\x0bx" if i == 7 else b"") + b"\n" for i, l in enumerate(lines)), 8, "U+000B (VERTICAL TAB)"),
    "form feed": ("train.de", lambda lines: b"".join(l + (b"\x0c" if i == 299 else b"") + b"\n" for i, l in enumerate(lines)), 300, "U+000C (FORM FEED)"),
    "ESC": ("test.en", lambda lines: b"".join(l + (b"\x1b[0m" if i == 1 else b"") + b"\n" for i, l in enumerate(lines)), 2, "U+001B (ESCAPE)"),
    "DEL": ("test.en", lambda lines: b"".join(l + (b"\x7f" if i == 1 else b"") + b"\n" for i, l in enumerate(lines)), 2, "U+007F (DELETE)"),
}


def _damage(corpus: Path, name: str, change) -> None:
    path = corpus / name
    path.write_bytes(change(path.read_bytes().split(b"\n")[:-1]))


@pytest.mark.parametrize("case", BAD_TEXT)
def test_a_line_terminator_or_control_character_is_an_error_naming_file_line_and_character(tmp_path, case):
    name, change, line, char = BAD_TEXT[case]
    corpus = write_files_corpus(tmp_path / "corpus")
    _damage(corpus, name, change)
    with pytest.raises(CorpusError, match=rf"^{corpus / name}:{line}: {char.replace('(', '[(]').replace(')', '[)]').replace('+', '[+]')}"
                                          r".* at character \d+: .*; or set data.bad_characters=replace"):
        graph.run(files_config(corpus), tmp_path / "work", "ingest")
    assert not list((tmp_path / "work").glob("ingest-*"))


@pytest.mark.parametrize("case", [c for c in BAD_TEXT if not c.startswith("CR-only")])
def test_bad_characters_replace_makes_each_a_space_and_counts_it(tmp_path, case):
    name, change, line, char = BAD_TEXT[case]
    corpus = write_files_corpus(tmp_path / "corpus")
    _damage(corpus, name, change)
    out = graph.run(files_config(corpus, "data.bad_characters=replace"), tmp_path / "work", "ingest")
    split = name.split(".")[0]
    counts = json.loads((out / "report.json").read_text())["splits"][split]
    assert counts["text"] == {f"replaced {char.split()[0]}": 1}
    rows = {row["id"]: row for row in pq.read_table(out / split).to_pylist()}
    side = "src" if name.endswith(".en") else "tgt"
    assert line not in rows or not any(c in rows[line][side] for c in "\x00\r\x0b\x0c\x1b\x7f\x85\u2028\u2029")


def test_cr_only_files_on_both_sides_are_an_error_not_one_giant_pair(tmp_path):
    """The first probe: both sides of `test` with CR-only endings was one pair of 12,752 characters, kept."""
    corpus = tmp_path / "corpus"
    shutil.copytree(BIBLE, corpus)
    for lang in ("en", "es"):
        path = corpus / f"test.{lang}"
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r"))
    cfg = load_config(None, ["data.source=files", f"data.local_dir={corpus}", "data.src_lang=en", "data.tgt_lang=es"])
    with pytest.raises(CorpusError, match=rf"^{corpus / 'test.en'}:1: U\+000D \(CARRIAGE RETURN\) at character \d+: "
                                          r"lines end at \\n or \\r\\n only"):
        graph.run(cfg, tmp_path / "work", "ingest")
    assert not list((tmp_path / "work").glob("ingest-*"))


@pytest.mark.parametrize("files", [["train.es"], ["train.en", "valid.es"], ["test.en"]])
def test_a_bom_at_the_start_of_a_file_is_removed_and_counted(tmp_path, files):
    corpus = tmp_path / "corpus"
    shutil.copytree(BIBLE, corpus)
    for name in files:
        (corpus / name).write_bytes(b"\xef\xbb\xbf" + (corpus / name).read_bytes())
    cfg = load_config(None, ["data.source=files", f"data.local_dir={corpus}", "data.src_lang=en", "data.tgt_lang=es"])
    out = graph.run(cfg, tmp_path / "work", "ingest")
    splits = json.loads((out / "report.json").read_text())["splits"]
    for split in ingest.SPLITS:
        expected = sum(name.startswith(split) for name in files)
        assert splits[split].get("text", {}) == ({"bom_removed": expected} if expected else {})
        first = pq.read_table(out / split).to_pylist()[0]
        assert not first["src"].startswith("\ufeff") and not first["tgt"].startswith("\ufeff")
    clean = graph.run(load_config(None, ["data.source=files", f"data.local_dir={BIBLE}", "data.src_lang=en",
                                         "data.tgt_lang=es"]), tmp_path / "clean", "ingest")
    for split in ingest.SPLITS:  # the same pairs as without the BOM
        assert pq.read_table(out / split).equals(pq.read_table(clean / split))


def test_tsv_lines_follow_the_same_rules(tmp_path):
    corpus = tmp_path / "tsv"
    _bible_tsv(corpus)
    path = corpus / "valid.tsv"
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3] + b"\x00"
    path.write_bytes(b"\n".join(lines))
    cfg = load_config(None, ["data.source=tsv", f"data.local_dir={corpus}"])
    with pytest.raises(CorpusError, match=rf"^{path}:4: U\+0000 \(NUL\)"):
        graph.run(cfg, tmp_path / "work", "ingest")


# --- one file per split and language

AMBIGUOUS = {
    "plain and gzipped": (lambda c: (c / "train.en.gz").write_bytes(gzip.compress((c / "train.en").read_bytes())),
                          "train.en and train.en.gz"),
    "different case": (lambda c: (c / "Train.en").write_bytes((c / "train.en").read_bytes()), "Train.en and train.en"),
    "different case, gzipped": (lambda c: (c / "VALID.DE.GZ").write_bytes(b""), "VALID.DE.GZ and valid.de"),
    "a tsv beside the files": (lambda c: (c / "test.tsv").write_text("a\tb\n", encoding="utf-8"), "test.en and test.tsv"),
}


@pytest.mark.parametrize("case", AMBIGUOUS)
def test_two_candidates_for_one_split_and_language_are_an_error_listing_both(tmp_path, case):
    make, listed = AMBIGUOUS[case]
    corpus = write_files_corpus(tmp_path / "corpus")
    make(corpus)
    with pytest.raises(CorpusError, match=rf"^ambiguous input in {corpus}: {listed} could each be the file for "
                                          r".*; ingest reads exactly one file per split and language"):
        graph.run(files_config(corpus), tmp_path / "work", "ingest")
    assert not (tmp_path / "work").exists() or not list((tmp_path / "work").glob("ingest-*"))


def test_tsv_source_with_per_language_files_beside_is_ambiguous_too(tmp_path):
    corpus = tmp_path / "tsv"
    _bible_tsv(corpus)
    shutil.copy(BIBLE / "train.en", corpus / "train.en")
    with pytest.raises(CorpusError, match=rf"ambiguous input in {corpus}: train.en and train.tsv"):
        graph.run(load_config(None, ["data.source=tsv", f"data.local_dir={corpus}"]), tmp_path / "work", "ingest")


def test_a_name_differing_only_in_case_is_not_read_silently(tmp_path):
    corpus = write_files_corpus(tmp_path / "corpus")
    (corpus / "valid.de").rename(corpus / "Valid.de")
    with pytest.raises(CorpusError, match=r"corpus file not found: .*valid\.de .*; Valid\.de is there, which ingest "
                                          r"does not read"):
        graph.run(files_config(corpus), tmp_path / "work", "ingest")


@pytest.mark.skipif(not (SHARED_DATA / "multi30k" / "train.en").is_file(), reason="needs ../shared/data/multi30k")
def test_named_corpora_in_local_dir_take_one_file_per_split_and_language_too(tmp_path):
    corpus = tmp_path / "m30k"
    shutil.copytree(SHARED_DATA / "multi30k", corpus)
    (corpus / "val.de.gz").write_bytes(gzip.compress((corpus / "val.de").read_bytes()))
    cfg = load_config(None, ["data.source=multi30k", f"data.local_dir={corpus}", "data.tgt_lang=de", "data.download=false"])
    with pytest.raises(CorpusError, match=r"ambiguous input in .*: val\.de and val\.de\.gz"):
        graph.run(cfg, tmp_path / "work", "ingest")


# --- a stage's identity is what it reads

@pytest.mark.parametrize("unread", ["README.md", "notes.txt", ".DS_Store", "train.fr", "train.en.bak", "test.en~"])
def test_files_ingest_does_not_read_change_nothing(tmp_path, unread):
    corpus = write_files_corpus(tmp_path / "corpus")
    before = graph.output_dir(files_config(corpus), tmp_path / "work", "ingest")
    (corpus / unread).write_text("anything\n", encoding="utf-8")
    assert graph.output_dir(files_config(corpus), tmp_path / "work", "ingest") == before
    assert set(ingest.input_fingerprint(files_config(corpus).data)) == {f"{s}.{l}" for s in ingest.SPLITS for l in ("en", "de")}


@pytest.mark.parametrize("edited", ["train.en", "valid.de", "test.en"])
def test_every_file_ingest_reads_is_in_its_key(tmp_path, edited):
    corpus = write_files_corpus(tmp_path / "corpus")
    before = graph.output_dir(files_config(corpus), tmp_path / "work", "ingest")
    (corpus / edited).write_bytes((corpus / edited).read_bytes() + b"one more\n")
    assert graph.output_dir(files_config(corpus), tmp_path / "work", "ingest") != before


def test_the_log_and_the_report_name_the_files_read(tmp_path, caplog):
    corpus = write_files_corpus(tmp_path / "corpus")
    (corpus / "notes.txt").write_text("not a corpus\n", encoding="utf-8")
    with caplog.at_level("INFO", logger="pipeline.stages.ingest.stage"):
        out = graph.run(files_config(corpus), tmp_path / "work", "ingest")
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("ingest reads"))
    assert line == (f"ingest reads 6 files from {corpus}: train.en, train.de, valid.en, valid.de, test.en, test.de")
    inputs = json.loads((out / "report.json").read_text())["inputs"]
    assert inputs == {name: hashlib.sha256((corpus / name).read_bytes()).hexdigest() for name in inputs}
    assert "notes.txt" not in inputs and len(inputs) == 6


@pytest.mark.skipif(not (SHARED_DATA / "multi30k" / "train.en").is_file(), reason="needs ../shared/data/multi30k")
def test_a_named_corpus_key_covers_only_the_language_pair_it_reads(tmp_path):
    corpus = tmp_path / "m30k"
    shutil.copytree(SHARED_DATA / "multi30k", corpus)
    cfg = load_config(None, ["data.source=multi30k", f"data.local_dir={corpus}", "data.tgt_lang=de", "data.download=false"])
    assert sorted(ingest.input_fingerprint(cfg.data)) == sorted(f"{stem}.{lang}" for stem in ("train", "val", "test_2016_flickr")
                                                                for lang in ("en", "de"))
    before = graph.output_dir(cfg, tmp_path / "work", "ingest")
    (corpus / "train.fr").write_bytes(b"changed\n")  # another language: not read for en-de
    assert graph.output_dir(cfg, tmp_path / "work", "ingest") == before
