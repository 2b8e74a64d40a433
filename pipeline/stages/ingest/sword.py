"""The `sword` source (the default): two SWORD Bible modules read with pysword.

Verses are aligned by reference, their OSIS markup cleaned to plain text, and the pairs split into
train/valid/test deterministically by a seeded hash of the reference; `id` is the verse's position in
canonical order. A cleaned verse follows the text rule of every reader (`readers.checked`): a control
character is an error naming the module and verse, or with `data.bad_characters=replace` a space, counted in
report.json's `text`. Whitespace, line terminators included, is folded by `clean_osis` first: in OSIS markup it is
layout, not text.
"""
from __future__ import annotations

import functools
import hashlib
import html
import logging
import re
from collections import Counter
from typing import Any, Optional

from pipeline.config import DataConfig
from pipeline.stages.ingest.readers import MB, CorpusError, RawSplit, TextRules, checked, too_big

log = logging.getLogger(__name__)

SWORD_INSTALL = "apt-get update && apt-get install -y sword-text-web sword-text-sparv"  # sudo unless root

_NOTE = re.compile(r"<note\b[^>]*>.*?</note>", re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
_WORD_END, _WORD_START = re.compile(r"\w$"), re.compile(r"\w")  # a footnote between two words is a space


def clean_osis(raw: str) -> str:
    """Plain verse text from OSIS markup: footnotes removed, tags stripped, entities decoded.

    A footnote sitting between two words (`God</w><note>…</note><w>created`) becomes a space, which
    pysword's own cleaner loses ("Godcreated"). Every other character is kept (a NUL too, which `checked` then
    names): whitespace is folded to single spaces."""
    text = ""
    for piece in (html.unescape(_TAG.sub("", piece)) for piece in _NOTE.split(raw)):  # the text between footnotes
        if _WORD_END.search(text) and _WORD_START.match(piece):
            text += " "
        text += piece
    return " ".join(text.split())


def read_sword(data: DataConfig) -> tuple[dict[str, RawSplit], dict[str, Any]]:
    """Verse-aligned pairs from two SWORD modules, split deterministically by hashed reference.

    Verses empty in either module (omitted verses, or books one module lacks text for) are not pairs
    at all: they are left out before the split and counted as `sword_empty_verses`."""
    counts: Counter[str] = Counter()
    every = read_sword_pairs(data.sword_path, data.sword_src_module, data.sword_tgt_module, data.max_input_mb,
                             TextRules.of(data), counts)
    pairs = [pair for pair in every if pair[1] and pair[2]]
    if not pairs:
        raise CorpusError(f"empty corpus: SWORD modules {data.sword_src_module} and {data.sword_tgt_module} "
                          f"in {data.sword_path} share no non-empty verses")
    order = sorted(range(len(pairs)), key=lambda i: hashlib.sha256(
        f"{data.split_seed}:{pairs[i][0]}".encode()).hexdigest())
    if data.test_size + data.valid_size >= len(pairs):
        raise CorpusError(f"data.valid_size + data.test_size = {data.valid_size + data.test_size} leaves no "
                          f"training pairs out of {len(pairs)} verses")
    chosen = {"test": order[: data.test_size], "valid": order[data.test_size: data.test_size + data.valid_size],
              "train": order[data.test_size + data.valid_size:]}
    origin = f"SWORD {data.sword_src_module} + {data.sword_tgt_module} in {data.sword_path}"
    splits = {}
    for split, indices in chosen.items():
        indices = sorted(indices)
        splits[split] = RawSplit([(pairs[i][3], pairs[i][1], pairs[i][2]) for i in indices], f"{origin} ({split})")
    notes: dict[str, Any] = {"sword_verses": len(every), "sword_empty_verses": len(every) - len(pairs)}
    if counts:
        notes["text"] = dict(sorted(counts.items()))
    return splits, notes


def read_sword_pairs(sword_path: str, src_module: str, tgt_module: str,
                     max_input_mb: int = DataConfig.max_input_mb, rules: TextRules = TextRules(),
                     counts: Optional[Counter[str]] = None) -> list[tuple[str, str, str, int]]:
    """(reference, src text, tgt text, id) for every verse both modules have, in canonical order; the id
    is the 1-based position in that order; each verse as `checked` by `rules` (replacements counted in
    `counts`). More than `max_input_mb` MB of verse text (both modules, as
    pysword returns it) is an error: SWORD modules are compressed.

    Verses are matched by (book, chapter, verse); where the two versifications differ (e.g. NRSVA vs
    KJV in Revelation 12/13) a few neighbouring verses may be paired off by one."""
    from pysword.modules import SwordModules

    modules = SwordModules(paths=[sword_path])
    try:
        found = modules.parse_modules()
    except (OSError, ValueError, IndexError) as error:  # pysword raises these on a missing/broken library
        found = {}
        log.debug("pysword: %s", error)
    missing = [name for name in (src_module, tgt_module) if name not in found]
    if missing:
        raise CorpusError(f"SWORD module(s) {missing} not found under {sword_path}. The default corpus "
                          f"needs the Debian packages: {SWORD_INSTALL} (with sudo unless root); without them, try "
                          f"--config configs/smoke.yaml (a Bible sample shipped in tests/data) or "
                          f"data.source=multi30k data.local_dir=<dir with train.en, train.de, ...>")
    bibles = [modules.get_bible_from_module(name) for name in (src_module, tgt_module)]
    for bible in bibles:
        if hasattr(bible, "_decompressed_text"):
            # pysword decompresses a whole book block for every verse; a small cache makes the full
            # read take well under a second instead of minutes.
            bible._decompressed_text = functools.lru_cache(maxsize=4)(bible._decompressed_text)
    src_bible, tgt_bible = bibles
    tgt_structure = tgt_bible.get_structure()
    pairs, size = [], 0
    counts = Counter() if counts is None else counts
    for books in src_bible.get_structure().get_books().values():
        for book in books:
            try:
                _, other = tgt_structure.find_book(book.osis_name)
            except ValueError:
                continue  # e.g. deuterocanonical books only one module has
            for chapter in range(1, min(book.num_chapters, other.num_chapters) + 1):
                count = min(book.chapter_lengths[chapter - 1], other.chapter_lengths[chapter - 1])
                verses = list(range(1, count + 1))
                src = list(src_bible.get_iter(books=book.name, chapters=chapter, verses=verses, clean=False))
                tgt = list(tgt_bible.get_iter(books=other.name, chapters=chapter, verses=verses, clean=False))
                if len(src) != count or len(tgt) != count:
                    raise CorpusError(f"SWORD {book.osis_name} {chapter}: expected {count} verses, read "
                                      f"{len(src)} ({src_module}) and {len(tgt)} ({tgt_module})")
                size += sum(len(text.encode("utf-8")) for text in (*src, *tgt))
                if size > max_input_mb * MB:
                    raise too_big(f"SWORD modules {src_module} and {tgt_module} in {sword_path}", max_input_mb, True)
                for verse, (a, b) in enumerate(zip(src, tgt), start=1):
                    reference = f"{book.osis_name}.{chapter}.{verse}"
                    src_text = checked(clean_osis(a), f"SWORD module {src_module} {reference}", rules, counts)
                    tgt_text = checked(clean_osis(b), f"SWORD module {tgt_module} {reference}", rules, counts)
                    pairs.append((reference, src_text, tgt_text, len(pairs) + 1))
    return pairs

