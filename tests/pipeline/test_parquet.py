import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import parquet
from pipeline.parquet import ROWS_PER_FILE, read_split, read_shard, shard_ranges, write_split

SCHEMA = pa.schema([("id", pa.int64()), ("src_ids", pa.list_(pa.int32())), ("text", pa.string())])


def make_table(rows: int) -> pa.Table:
    return pa.table({"id": pa.array(range(rows), pa.int64()),
                     "src_ids": pa.array([[i, i + 1] for i in range(rows)], pa.list_(pa.int32())),
                     "text": pa.array([f"row {i}" for i in range(rows)], pa.string())}, schema=SCHEMA)


def test_round_trip_keeps_rows_in_order_across_files(tmp_path):
    table = make_table(2 * ROWS_PER_FILE + 5)
    write_split(table, tmp_path / "train")
    back = read_split(tmp_path / "train")
    assert back.schema == SCHEMA
    assert back.to_pylist() == table.to_pylist()
    assert pq.read_table(tmp_path / "train").to_pylist() == table.to_pylist()  # a plain directory read agrees


def test_layout_is_numbered_files_of_rows_per_file(tmp_path):
    table = make_table(2 * ROWS_PER_FILE + 5)
    write_split(table, tmp_path / "train")
    files = sorted((tmp_path / "train").iterdir())
    assert [f.name for f in files] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert [pq.ParquetFile(f).metadata.num_rows for f in files] == [ROWS_PER_FILE, ROWS_PER_FILE, 5]
    # each file is exactly what a default pq.write_table of its slice gives (no other write options)
    for index, path in enumerate(files):
        reference = io.BytesIO()
        pq.write_table(table.slice(index * ROWS_PER_FILE, ROWS_PER_FILE), reference)
        assert path.read_bytes() == reference.getvalue()


def test_empty_split_writes_one_file_with_the_schema(tmp_path):
    write_split(SCHEMA.empty_table(), tmp_path / "valid")
    assert [f.name for f in (tmp_path / "valid").iterdir()] == ["part-00000.parquet"]
    back = read_split(tmp_path / "valid")
    assert back.num_rows == 0 and back.schema == SCHEMA


def test_read_without_files_needs_a_schema(tmp_path):
    (tmp_path / "none").mkdir()
    assert read_split(tmp_path / "none", SCHEMA).schema == SCHEMA
    assert read_split(tmp_path / "none", SCHEMA).num_rows == 0
    with pytest.raises(FileNotFoundError, match="no part-"):
        read_split(tmp_path / "none")


def test_write_refuses_an_existing_directory(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(FileExistsError):
        write_split(make_table(3), tmp_path / "train")


@pytest.mark.parametrize("rows, world_size", [(2 * ROWS_PER_FILE + 5, 1), (2 * ROWS_PER_FILE + 5, 2), (1000, 3),
                                              (400, 2), (100, 2), (129, 2), (5, 8), (0, 2)])
def test_the_ranks_shards_are_disjoint_cover_the_split_and_are_balanced(rows, world_size):
    """shard_ranges against a brute-force check of every row: each row read by exactly one rank, each rank's
    ranges increasing, the counts within one row of each other, every rank drawing from the whole split."""
    shards = [shard_ranges(rows, rank, world_size) for rank in range(world_size)]
    owners = [[rank for rank, ranges in enumerate(shards) for start, stop in ranges if start <= row < stop]
              for row in range(rows)]
    assert all(len(owner) == 1 for owner in owners)
    for ranges in shards:
        assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
    counts = [sum(stop - start for start, stop in ranges) for ranges in shards]
    assert sum(counts) == rows and max(counts) - min(counts) <= 1
    if rows >= 64 * world_size:  # each rank has rows in the split's last sixteenth and in its first
        assert all(ranges[0][0] < rows // 16 and ranges[-1][1] > rows - rows // 16 for ranges in shards)
    assert shard_ranges(rows, 0, 1) == ([(rows * j // min(rows, 64), rows * (j + 1) // min(rows, 64))
                                         for j in range(min(rows, 64))])


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_read_shard_reads_each_ranks_rows_in_order_and_together_the_split(tmp_path, world_size):
    table = make_table(3 * ROWS_PER_FILE + 17)
    write_split(table, tmp_path / "train")
    rows = []
    for rank in range(world_size):
        shard = read_shard(tmp_path / "train", rank, world_size, ["id", "src_ids"])
        assert shard.column_names == ["id", "src_ids"]
        ids = shard.column("id").to_pylist()
        assert ids == sorted(ids)  # row order
        expected = [i for start, stop in shard_ranges(table.num_rows, rank, world_size) for i in range(start, stop)]
        assert ids == expected and shard.column("src_ids").to_pylist() == [[i, i + 1] for i in ids]
        rows.extend(ids)
    assert sorted(rows) == list(range(table.num_rows))
    if world_size == 1:
        assert read_shard(tmp_path / "train", 0, 1).to_pylist() == table.to_pylist()


def test_a_rank_without_rows_gets_an_empty_table_with_the_columns(tmp_path):
    write_split(make_table(1), tmp_path / "train")
    assert read_shard(tmp_path / "train", 0, 2, ["src_ids"]).num_rows == 1
    empty = read_shard(tmp_path / "train", 1, 2, ["src_ids"])
    assert empty.num_rows == 0 and empty.column_names == ["src_ids"]
    with pytest.raises(FileNotFoundError, match="no part"):
        read_shard(tmp_path / "missing", 0, 1)


@pytest.mark.parametrize("pieces", [[0], [5, 0, 3], [ROWS_PER_FILE - 1, 1, 2 * ROWS_PER_FILE + 3, 0, 7], [3 * ROWS_PER_FILE]])
def test_split_writer_writes_the_files_of_write_split(tmp_path, pieces):
    """Tables of any sizes written in turn give byte for byte `write_split`'s files of their concatenation
    (the tokenize driver writes its splits this way: tests/pipeline/test_tokenize.py)."""
    table = make_table(sum(pieces))
    write_split(table, tmp_path / "whole")
    with parquet.SplitWriter(tmp_path / "streamed", SCHEMA) as writer:
        start = 0
        for rows in pieces:
            writer.write(table.slice(start, rows))
            start += rows
    names = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "streamed").iterdir())
    for name in names:
        assert (tmp_path / "streamed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
