"""Write a tiny SWORD zText Bible module (the on-disk format pysword reads), for tests."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

from pysword.books import BibleStructure


def write_ztext_module(library: Path, name: str, verses: dict[tuple[str, int, int], str],
                       lang: str = "en") -> None:
    """An OT-only, KJV-versified module `name` under `library` holding `verses` {(book, ch, v): osis}."""
    structure = BibleStructure("kjv", ["ot"])
    blob = bytearray()
    records: dict[int, tuple[int, int]] = {}
    for (book, chapter, verse), text in verses.items():
        (index,) = structure.ref_to_indicies(books=book, chapters=chapter, verses=verse)["ot"]
        data = text.encode("utf-8")
        records[index] = (len(blob), len(data))
        blob += data
    data_dir = library / "modules" / "texts" / "ztext" / name.lower()
    data_dir.mkdir(parents=True)
    compressed = zlib.compress(bytes(blob))
    (data_dir / "ot.bzz").write_bytes(compressed)
    (data_dir / "ot.bzs").write_bytes(struct.pack("<III", 0, len(compressed), len(blob)))
    index_file = bytearray()
    for index in range(max(records) + 1):
        start, length = records.get(index, (0, 0))
        index_file += struct.pack("<IIH", 0, start, length)
    (data_dir / "ot.bzv").write_bytes(bytes(index_file))
    conf_dir = library / "mods.d"
    conf_dir.mkdir(exist_ok=True)
    (conf_dir / f"{name.lower()}.conf").write_text(
        f"[{name}]\nDataPath=./modules/texts/ztext/{name.lower()}/\nModDrv=zText\nSourceType=OSIS\n"
        f"Encoding=UTF-8\nCompressType=ZIP\nBlockType=BOOK\nVersification=KJV\nLang={lang}\n",
        encoding="utf-8")
