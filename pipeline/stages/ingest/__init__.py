"""Ingest stage: a parallel corpus in, validated Parquet splits out (`id` int64, `src`, `tgt` string).

Sources (`data.source`):
- `files`: `<local_dir>/<split>.<lang>` text files (optionally `.gz`, `.bz2`, `.xz`, `.lzma`: `compression`), one
  sentence per line;
- `tsv`: `<local_dir>/<split>.tsv[.gz|...]`, `src<TAB>tgt` per line;
- named corpora (`multi30k`, `iwslt14`, `wmt16_enro`, `wmt14_ende`): read from `local_dir` when it holds
  the split's files, otherwise downloaded into `cache_dir` (WMT test sets through sacreBLEU);
- `sword` (the default): two SWORD Bible modules read with pysword, aligned by verse reference and split
  deterministically by a seeded hash of the reference.

Validation (one policy for every reader, docs/USAGE.md "Bad input"): sides with different line counts, invalid
UTF-8 (unless `lenient`), a UTF-16/32 byte order mark, a line terminator, control character or lone surrogate
inside a line (`reder.text`; unless `bad_characters=replace`), missing files, two candidate files for one split
and language (a plain file and any compressed sibling), a compression Python cannot read, and an empty result are
errors naming the file (and line); a leading BOM is removed and counted. Local files are streamed (docs/OPERATIONS.md, "Text and input files"). Empty lines, over-long lines, extreme length ratios
and duplicate pairs are dropped from train and counted by reason in `report.json`; in valid/test they
are only counted (`flagged`), so test sets stay intact. `id` is the 1-based line number in the source
file (for `sword`, the verse's position in canonical order). Each split is written by
`pipeline.parquet.write_split` (`part-NNNNN.parquet` files of ROWS_PER_FILE rows, in id order).

One module per job: `stage` (the build, and `input_fingerprint`, what pipeline/stagekeys.py's
`ingest_key` hashes of the inputs), `readers` (`files`, `tsv`, the text rule `checked` every reader applies, and the
split names, RawSplit and CorpusError they share), `compression` (the one table of compressed-file suffixes and
magic bytes), `filters`, `corpora` (named corpora and their
downloads), `sword`. This package re-exports what other modules use as `pipeline.stages.ingest.<name>`.
"""
from pipeline.stages.ingest.corpora import NAMED, Archive, NamedCorpus, SplitSource
from pipeline.stages.ingest.readers import CorpusError
from pipeline.stages.ingest.stage import SPLITS, build, input_fingerprint, read_corpus, summary
from pipeline.stages.ingest.sword import clean_osis, read_sword

__all__ = ["NAMED", "SPLITS", "Archive", "CorpusError", "NamedCorpus", "SplitSource", "clean_osis",
           "build", "input_fingerprint", "read_corpus", "read_sword", "summary"]
