import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.parquet import ROWS_PER_FILE, read_split, write_split

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
