"""DuckDB's own Parquet reader for a file whose text was checked (``dpsql.engine.duckdb``).

By default (``invalid_text = "null"``) a Parquet file is read through Arrow, text as bytes
decoded with ``TRY(DECODE(...))`` (``dpsql.engine._duckdb_sources``): total, but 1.5 to 2.5
times the work of DuckDB's own reader, which raises on invalid UTF-8 (a failure that depends on
one cell). This module gives the same values through DuckDB's own reader, without that failure:

* **Which files.** Only a flat schema of integers, floats, booleans, text and binary (the types
  DuckDB's reader converts in no way that can fail), the same schema in every file, and the
  same column names and DuckDB types as the Arrow view (checked by binding both), and no file
  name holding a glob character (DuckDB's reader would expand ``[ab].parquet`` into ``a.parquet``
  and ``b.parquet``). Any other source keeps the Arrow view.
* **One check per column and file version.** A text column is read once with pyarrow, in batches,
  keeping Parquet's dictionaries, and each batch's dictionary (or values) is validated as UTF-8
  in C++; only a batch that fails is searched, by halving, for its invalid values, whose rows
  are found by their dictionary index (:func:`invalid_cells`). Arrow's validation rejects
  exactly the strings DuckDB's ``TRY(DECODE(value))`` (the Arrow view's reading) makes NULL
  (``tests/test_native_first_read.py`` compares them on seeded random bytes). The file version
  is its ``(device, inode, size, mtime, ctime)``; a file modified less than
  :data:`SETTLE_SECONDS` before the check is not trusted (file times are coarse: a rewrite in
  the same tick could keep them). A check that cannot read the files keeps the Arrow view.
* **The native view.** ``read_parquet(..., utf8_validation = 'replace', hive_partitioning = false)``
  never raises on text, and reads each column from the file as the Arrow view does (a
  ``user_id=7/`` directory in a path does not override the ``user_id`` stored in its rows);
  the cells listed are NULL (a left join with a registered table of their file name and row
  number, one flag per text column), the rest are the valid text the Arrow view decodes,
  capped at ``max_text_bytes`` on the same stored length. Values are equal to the Arrow
  view's, cell by cell. The join is there with or without invalid cells (an empty table), so
  one person's invalid cell does not change the plan: its cost is one more row on the join's
  build side (measured at 1M rows: CPU 0.320 s without, 0.324 s with one invalid cell).
* **A rebuild that fails.** Each build of the native view registers its flags under a name of
  its own, replaces the view in one statement, and only then drops the previous flags
  (``DuckDBBackend._native_rebuild``). So an exception between the check and the replacement
  (the statement time-out interrupts every statement once the check has outlasted it) leaves
  the previous view reading its own flags: the read fails as any time-out does and the next
  one reads the same values (the flags' columns are named by position: one shared table once
  let the previous view read a newer build's, a column's NULLs at another column's invalid
  cells). An interrupt is the time-out's failure, not a reason to keep the Arrow view for good.
* **A changed file.** Before each private read every file is stat'ed: a version other than the
  checked one is checked again before the read (the Arrow view if it was modified less than
  :data:`SETTLE_SECONDS` ago). After the read the files are stat'ed again: if one changed meanwhile, the read is
  discarded and the caller raises the one generic error of a failed private read. So the
  outcome depends on the files' versions (the owner's metadata), never on a cell.
* **When.** A text column is checked on the first private read in a process whose query may
  read it (and again after its file changes): the columns the query names, from its text alone
  (:func:`reads_of`; every column where it may read one without naming it, ``SELECT *`` and the
  like). The native view reads a text column not yet checked as NULL; a query that may read it
  checks it first, so every text cell a private read reads was checked. Each read checks the
  files' schemas (their footers), with or without a column to check. The check costs less than
  reading through Arrow (at 10M rows of two text columns about 0.2-0.3 CPU s, most of it the
  longer column, against about 1 CPU s more for the Arrow view's read of the query,
  ``docs/performance.md``). The timing of that read grows by the check, a function of the
  query's columns, the file's size and, by a few milliseconds per batch holding one, of the
  invalid cells.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from sqlglot import exp

from dpsql.engine.base import view_column

#: a file modified less than this many seconds before its check keeps the Arrow view
SETTLE_SECONDS = 2.0
#: rows per batch of the check's read: at most this many...
_BATCH = 1 << 20
#: ...and about this many stored bytes of text (from the file's footer) per batch
_BATCH_BYTES = 32 << 20

Version = tuple[tuple[int, int, int, int, int], ...]


class SpecialFile(OSError):
    """A source's file that is now a named pipe, a socket or a device (registration refuses one): opened, a FIFO
    would make a reader wait for a writer for ever."""


def versions(paths: list[str]) -> Version:
    """``(device, inode, size, mtime_ns, ctime_ns)`` of each file (OSError if one is missing; :class:`SpecialFile`
    if one is a named pipe, a socket or a device: from its metadata, never opened)."""
    import stat

    out = []
    for p in paths:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            raise SpecialFile(f"the file {p!r} became {'a named pipe (FIFO)' if stat.S_ISFIFO(st.st_mode) else 'a special file'}")
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


def settled(version: Version, now: float | None = None) -> bool:
    now = time.time() if now is None else now
    newest = max((max(v[3], v[4]) for v in version), default=0) / 1e9
    return now - newest >= SETTLE_SECONDS


def _flat(t: pa.DataType) -> bool:
    T = pa.types
    if T.is_dictionary(t):
        return _flat(t.value_type)
    return (T.is_integer(t) or T.is_floating(t) and not T.is_float16(t) or T.is_boolean(t) or T.is_string(t)
            or T.is_large_string(t) or T.is_binary(t) or T.is_large_binary(t))


def _text(t: pa.DataType) -> bool:
    T = pa.types
    if T.is_dictionary(t):
        return _text(t.value_type)
    return T.is_string(t) or T.is_large_string(t)


def eligible(schema: pa.Schema) -> bool:
    """Whether every column is of a type DuckDB's reader reads totally (flat, see module doc) and
    no column name meets the names the native view adds (the reader's file name and row number)."""
    names = [f.name.lower() for f in schema]
    return (all(_flat(f.type) for f in schema) and len(set(names)) == len(names)
            and not any(n in ("filename", "file_row_number") or n.startswith("_dpsql_") for n in names))


@dataclass
class NativeSource:
    """One registered Parquet source that may be read natively."""

    name: str
    view: str
    paths: list[str]
    schema: pa.Schema
    arrow_select: exp.Select
    reads: int = 0
    checked: Version | None = None  # the version the native view was built for (None: Arrow view)
    disabled: bool = False  # the native reader does not give the Arrow view's schema
    bad: dict[str, np.ndarray] = field(default_factory=dict)  # per checked text column: (file, row) rows
    columns: frozenset[str] = frozenset()  # the text columns checked in version ``checked``
    marks: str | None = None  # the flags table the native view joins (a name of its own per build)
    stale: list[str] = field(default_factory=list)  # flags tables to drop once the view is replaced

    @property
    def text_columns(self) -> list[str]:
        return [f.name for f in self.schema if _text(f.type)]


@dataclass(frozen=True)
class Reads:
    """What a private read's query may read of a source's columns, from the query's text alone
    (:func:`reads_of`): never from a cell, so which columns are checked, and how long that takes,
    depends on the query and the catalog only."""

    names: frozenset[str] | None  # every identifier of the query, lower-cased; None: any column
    strings: tuple[str, ...] = ()  # the query's string literals

    def text_columns(self, src: NativeSource) -> list[str]:
        """The text columns of ``src`` the query may read: those it names, or all of them where it
        may read a column without naming it, or names the source otherwise than as a table."""
        cols = src.text_columns
        if self.names is None or src.view.lower() not in self.names or any(src.view in s for s in self.strings):
            return cols
        return [c for c in cols if view_column(c) in self.names]


def reads_of(ast: exp.Expression) -> Reads:
    """The columns ``ast`` may read (:class:`Reads`): a column is read only where its name is an
    identifier of the query (a superset: a table's, a column alias's or another source's column of that
    name counts too; not a table alias's own name, which names a relation: a column named as the bounded
    SQL's subqueries are, ``__where``, is not read by every query that has one), except where a column
    can be read without its name, which reads every column: ``*`` other than ``COUNT(*)`` (``SELECT *``,
    ``t.*``, a function's ``*``), ``COLUMNS(...)``, a NATURAL join, PIVOT / UNPIVOT, and a table or alias
    used as a column (DuckDB reads it as a struct of every column)."""
    names: set[str] = set()
    relations: set[str] = set()
    columns: set[str] = set()
    strings: list[str] = []
    for node in ast.walk():
        if isinstance(node, exp.Identifier):
            if not (isinstance(node.parent, exp.TableAlias) and node.arg_key == "this"):
                names.add(node.name.lower())
        elif isinstance(node, exp.Literal):
            if node.is_string:
                strings.append(node.name)
        elif isinstance(node, exp.Star):
            if not (isinstance(node.parent, exp.Count) and node.arg_key == "this") and not _star_of_subqueries(node):
                return Reads(None)
        elif isinstance(node, (exp.Columns, exp.Pivot)) or (isinstance(node, exp.Anonymous)
                                                            and node.name.upper() == "COLUMNS"):
            return Reads(None)
        elif isinstance(node, exp.Join):
            if node.method == "NATURAL":
                return Reads(None)
        elif isinstance(node, exp.Table):
            relations.add(node.name.lower())
        elif isinstance(node, exp.TableAlias):
            relations.add(node.name.lower())
        elif isinstance(node, exp.Column):
            columns.add(node.name.lower())
    if columns & relations:
        return Reads(None)
    return Reads(frozenset(names), tuple(strings))


def _star_of_subqueries(star: exp.Star) -> bool:
    """Whether ``star`` is a ``SELECT *`` whose every source is a subquery, or a ``SELECT alias.*`` whose
    source ``alias`` is a subquery: it then reads only the columns those subqueries select, each walked
    (and named or starred) on its own."""
    node: exp.Expression = star
    qualified = isinstance(star.parent, exp.Column) and star.arg_key == "this"
    if qualified:
        assert star.parent is not None
        node = star.parent
    select = node.parent
    if not isinstance(select, exp.Select) or node.arg_key != "expressions":
        return False
    sources = [select.args.get("from_"), *(select.args.get("joins") or [])]
    if qualified:
        alias = node.text("table").lower()
        named = [s for s in sources if s is not None and s.this.alias_or_name.lower() == alias]
        return len(named) == 1 and isinstance(named[0].this, exp.Subquery)
    return all(s is not None and isinstance(s.this, exp.Subquery) for s in sources)


def _valid(values: pa.Array) -> bool:
    """Whether every non-NULL text value of ``values`` is UTF-8 (Arrow's full validation; the same
    strings as DuckDB's ``TRY(DECODE(...))``, ``tests/test_native_parquet.py``)."""
    try:
        values.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


#: bytes of text one step of :func:`invalid_mask` validates at once (and, where that fails, reads byte by byte: its
#: temporary arrays up to about 50 bytes per non-ASCII byte); a longer value is validated alone
_MASK_BYTES = 1 << 18
#: the length of the UTF-8 sequence each byte starts (0: a byte that starts none: a continuation byte, C0, C1,
#: F5-FF)
_SEQ_LEN = np.array([1] * 0x80 + [0] * 0x42 + [2] * 0x1E + [3] * 0x10 + [4] * 0x05 + [0] * 0x0B, np.int64)


def invalid_mask(values: pa.Array) -> np.ndarray:
    """Per value of ``values`` (text or bytes), whether it is not UTF-8 (NULL: False), decided with no Python work
    per value: in steps of about :data:`_MASK_BYTES` bytes, each validated by Arrow (C++), and a step that fails
    read by a few numpy passes over its non-ASCII bytes. So the work is one validation of the bytes plus numpy
    passes over the steps holding an invalid value (a step of others' non-ASCII text with one invalid value:
    about 6 ms), however many values in them are invalid. (Halving
    down to single values cost about 2 log2(n) validations per invalid value: one person's 400 000 distinct invalid
    texts made a first read 2.9 s of CPU against 0.12 s.) Strict UTF-8, as Arrow's validation and DuckDB's
    ``TRY(DECODE(...))`` read it: no overlong form, no surrogate, nothing above U+10FFFF
    (``tests/test_native_first_read.py``)."""
    if pa.types.is_string(values.type) or pa.types.is_binary(values.type):
        off_type: Any = np.int32
    elif pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type):
        off_type = np.int64
    else:  # (a string view: its values as large bytes)
        return invalid_mask(values.cast(pa.large_binary()))
    m = len(values)
    out = np.zeros(m, bool)
    if m == 0:
        return out
    bufs = values.buffers()
    offsets = np.frombuffer(bufs[1], off_type, m + 1, values.offset * np.dtype(off_type).itemsize).astype(np.int64)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    j = 0
    while j < m:
        if offsets[j + 1] - offsets[j] > _MASK_BYTES:  # one long value: validated alone, in C++ (no array per byte)
            out[j] = not _valid_text(values.slice(j, 1))
            j += 1
            continue
        # values j .. k-1: as many as fit in _MASK_BYTES; looked at byte by byte only if Arrow's validation (C++)
        # fails them, so one invalid value costs numpy passes over its step, not over other people's text
        k = int(np.searchsorted(offsets, offsets[j] + _MASK_BYTES, side="right")) - 1
        k = min(max(k, j + 1), m)
        if not _valid_text(values.slice(j, k - j)):
            out[j:k] = _invalid_run(data, offsets[j:k + 1])
        j = k
    if values.null_count:
        out &= np.asarray(values.is_valid().to_numpy(zero_copy_only=False), bool)
    return out


def _valid_text(values: pa.Array) -> bool:
    """:func:`_valid` of text or bytes (bytes read as text, zero-copy)."""
    if pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
        values = values.view(pa.large_string() if pa.types.is_large_binary(values.type) else pa.string())
    return _valid(values)


def _invalid_run(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """:func:`invalid_mask` of the values between ``offsets`` (absolute, into ``data``). ASCII bytes are valid
    wherever they stand, so only the other bytes are looked at: each must be a sequence's first byte followed
    by as many continuation bytes as it announces, inside its value."""
    base = int(offsets[0])
    b = data[base:int(offsets[-1])]
    o = offsets - base
    m = len(o) - 1
    hi = np.flatnonzero(b >= 0x80)
    if not len(hi):
        return np.zeros(m, bool)
    v = b[hi]
    cont = (v & 0xC0) == 0x80
    # where each non-ASCII byte's sequence may end: the next non-ASCII byte that is not a continuation, the next
    # ASCII byte, or its value's end
    value = np.searchsorted(o, hi, side="right") - 1
    # same_run[i]: the next non-ASCII byte is the very next byte, in the same value
    same_run = np.zeros(len(hi), bool)
    same_run[:-1] = (hi[1:] == hi[:-1] + 1) & (value[1:] == value[:-1])
    idx = np.arange(len(hi))
    # a sequence ends after i where the run ends or the next byte starts a sequence of its own
    ends = np.flatnonzero(~same_run | ~np.concatenate([cont[1:], [True]]))
    seq_end = hi[ends[np.searchsorted(ends, idx)]] + 1  # the end of the sequence of the byte at i
    starts = ~cont
    lead = v[starts]
    length = seq_end[starts] - hi[starts]
    bad = np.zeros(len(hi), bool)
    bad[starts] = _SEQ_LEN[lead] != length
    second = np.minimum(idx[starts] + 1, len(hi) - 1)
    s2 = v[second]
    bad[starts] |= (length >= 2) & (((lead == 0xE0) & (s2 < 0xA0)) | ((lead == 0xED) & (s2 > 0x9F))
                                    | ((lead == 0xF0) & (s2 < 0x90)) | ((lead == 0xF4) & (s2 > 0x8F)))
    # a continuation byte that no sequence of its run covers: the first byte of its run, or of its value
    bad |= cont & np.concatenate([[True], ~same_run[:-1]])
    out = np.zeros(m, bool)
    out[value[bad]] = True
    return out


def _batch_rows(pf: Any, cols: list[str]) -> int:
    """Rows per batch of the check's read of one file: :data:`_BATCH`, fewer where the text
    columns store more than :data:`_BATCH_BYTES` per batch (footer sizes, no row read). A batch
    repeats its row group's dictionary, so larger batches validate each dictionary fewer times."""
    meta = pf.metadata
    names = set(cols)
    stored = sum(meta.row_group(g).column(j).total_uncompressed_size
                 for g in range(meta.num_row_groups) for j in range(meta.num_columns)
                 if meta.row_group(g).column(j).path_in_schema in names)
    per_row = stored / max(meta.num_rows, 1)
    return int(max(4096, min(_BATCH, _BATCH_BYTES / max(per_row, 1.0))))


def invalid_cells(src: NativeSource, threads: int = 1,
                  columns: list[str] | None = None) -> dict[str, np.ndarray] | None:
    """Per text column of ``columns`` (default: every text column), the (file index, row number)
    of each cell the Arrow view reads as NULL because it is not UTF-8, as the rows of one sorted
    integer array (n x 2); None when a file's schema
    differs from the first file's (checked from the footers, with or without columns to read).

    One streaming read of the text columns in batches (:func:`_batch_rows`), dictionaries kept
    (Parquet's dictionary pages): a batch's dictionary (or its values, for a column stored
    without one) is validated as a whole in C++, so the work is one decoding of the columns'
    indices and one validation of their distinct values per batch. Only a batch whose values
    are not all UTF-8 goes further: its invalid values are found by a few numpy passes over its
    values' bytes (:func:`invalid_mask`) and its rows by their dictionary index, one pass over
    that batch's indices, the rows kept as arrays: a few milliseconds per batch that holds an
    invalid cell, however many it holds, with no Python work per value or cell. The row
    groups of each file are shared among ``threads`` threads (the engine's ``threads``)."""
    try:
        return _invalid_cells(src, threads, src.text_columns if columns is None else columns)
    finally:
        # the batches' memory back to the system before the read (pyarrow's allocator keeps freed
        # memory: about 100 MB at 10M rows stayed resident through the query that followed)
        pa.default_memory_pool().release_unused()


def _invalid_cells(src: NativeSource, threads: int, cols: list[str]) -> dict[str, np.ndarray] | None:
    import pyarrow.parquet as pq

    parts: list[tuple[int, str, list[int], int]] = []  # (file index, path, row groups, first row)
    for i, p in enumerate(src.paths):
        pf = pq.ParquetFile(p)
        if not pf.schema_arrow.equals(src.schema):
            return None
        meta = pf.metadata
        sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        per = -(-len(sizes) // max(threads, 1))  # contiguous row groups, one share per thread
        for g in range(0, len(sizes), per):
            parts.append((i, p, list(range(g, min(g + per, len(sizes)))), sum(sizes[:g])))
    if not cols:
        return {}
    if threads <= 1 or len(parts) <= 1:
        found = [_invalid_in(part, cols) for part in parts]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=threads) as pool:  # pyarrow decodes without the GIL
            found = list(pool.map(lambda part: _invalid_in(part, cols), parts))
    return {c: _cells([f[c] for f in found]) for c in cols}


def _cells(parts: list[np.ndarray]) -> np.ndarray:
    """The (file index, row number) rows of ``parts`` in one array, sorted."""
    cells = np.concatenate([np.zeros((0, 2), np.int64), *parts])
    return cells[np.lexsort((cells[:, 1], cells[:, 0]))]


def _invalid_in(part: tuple[int, str, list[int], int], cols: list[str]) -> dict[str, np.ndarray]:
    """The invalid cells of some row groups of one file (:func:`invalid_cells`), per column: an array of (file
    index, row number) rows, built without Python work per cell."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    i, p, groups, start = part
    out: dict[str, list[np.ndarray]] = {c: [] for c in cols}
    pf = pq.ParquetFile(p, read_dictionary=cols)
    for b in pf.iter_batches(batch_size=_batch_rows(pf, cols), row_groups=groups, columns=cols, use_threads=False):
        for c in cols:
            a = b.column(c)
            values, indices = (a.dictionary, a.indices) if pa.types.is_dictionary(a.type) else (a, None)
            if _valid(values):
                continue
            at = np.flatnonzero(invalid_mask(values))
            if indices is None:
                rows = at
            else:
                hit = pc.is_in(indices, value_set=pa.array(at, indices.type))
                rows = pc.indices_nonzero(pc.fill_null(hit, False)).to_numpy().astype(np.int64)
            out[c].append(np.stack([np.full(len(rows), i, np.int64), rows + start], axis=1))
        start += b.num_rows
    return {c: _cells(v) for c, v in out.items()}


def native_select(src: NativeSource, capped: Callable[[exp.Expression], exp.Select], marks: str,
                  columns: frozenset[str] | None = None,
                  bad: dict[str, Any] | None = None) -> tuple[exp.Select, pa.Table | None]:
    """DuckDB's reader over ``src``'s files (text never raises), each listed invalid cell NULL.
    ``capped(relation)`` is the backend's select of every column through ``_duck_plan``.
    ``columns`` are the text columns checked (default: all, each with its list in ``bad``, by
    default ``src.bad``);
    a text column not checked is NULL in this view, which is used only by reads that do not name
    it (:class:`Reads`). With checked text columns, also the table of the invalid cells' (file,
    row) to register as ``marks``: the view joins it (a hash join whose build side grows with the
    number of invalid cells, not a literal list), with or without invalid cells, so that a file
    with one invalid cell is read by the same plan as a file with none. The flags' columns are
    named by position among ``columns``: the view reads only the table built with it (``marks``,
    a name of its own per build, :meth:`dpsql.engine.duckdb.DuckDBBackend._native_views`)."""
    bad = src.bad if bad is None else bad
    files = exp.Array(expressions=[exp.Literal.string(p) for p in src.paths])
    opts: list[exp.Expression] = [exp.EQ(this=exp.column("utf8_validation"), expression=exp.Literal.string("replace")),
                                  exp.EQ(this=exp.column("hive_partitioning"), expression=exp.false()),
                                  # a BLOB stays a BLOB whatever the connection's binary_as_string
                                  exp.EQ(this=exp.column("binary_as_string"), expression=exp.false())]
    cols = [c for c in src.text_columns if columns is None or c in columns]
    unchecked = {c for c in src.text_columns if c not in cols}
    if not cols:
        sel = capped(exp.Table(this=exp.func("read_parquet", files, *opts)))
        return (_unchecked_null(sel, unchecked) if unchecked else sel), None
    opts += [exp.EQ(this=exp.column("file_row_number"), expression=exp.true()),
             exp.EQ(this=exp.column("filename"), expression=exp.true())]
    inner = capped(exp.Table(this=exp.func("read_parquet", files, *opts)))
    inner = inner.select(exp.alias_(exp.column("filename"), "_dpsql_file", quoted=True),
                         exp.alias_(exp.column("file_row_number"), "_dpsql_row", quoted=True))
    flags = {c: f"_dpsql_bad_{j}" for j, c in enumerate(cols)}
    keys = {c: _cell_keys(bad[c]) for c in cols}
    rows = _distinct(np.concatenate([np.zeros(0, np.int64), *keys.values()]))
    table = {"_dpsql_file": pa.array(src.paths, pa.string()).take(pa.array(rows >> _ROW_BITS)),
             "_dpsql_row": pa.array(rows & ((1 << _ROW_BITS) - 1), pa.int64())}
    for c, flag in flags.items():
        table[flag] = pa.array(np.isin(rows, keys[c], assume_unique=True), pa.bool_())
    items = []
    for f in src.schema:
        value = exp.column(view_column(f.name), table="__s", quoted=True)
        if f.name in unchecked:
            value = exp.cast(exp.Null(), "VARCHAR")
        elif f.name in flags:
            value = exp.Case(ifs=[exp.If(this=exp.column(flags[f.name], table="__b", quoted=True), true=exp.Null())],
                             default=value)
        items.append(exp.alias_(value, view_column(f.name), quoted=True))
    on = exp.and_(exp.EQ(this=exp.column("_dpsql_file", table="__b", quoted=True),
                         expression=exp.column("_dpsql_file", table="__s", quoted=True)),
                  exp.EQ(this=exp.column("_dpsql_row", table="__b", quoted=True),
                         expression=exp.column("_dpsql_row", table="__s", quoted=True)))
    sel = exp.select(*items).from_(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("__s")))) \
        .join(exp.to_table(marks, quoted=True).as_("__b"), on=on, join_type="left")
    return sel, pa.table(table)


#: a cell's key in :func:`native_select`: its file index above this many bits of its row number
_ROW_BITS = 40


def _cell_keys(cells: Any) -> np.ndarray:
    """(file index, row number) rows as one sorted integer each (:data:`_ROW_BITS`)."""
    a = np.asarray(cells, np.int64).reshape(-1, 2)
    return _distinct((a[:, 0] << _ROW_BITS) | a[:, 1])


def _distinct(keys: np.ndarray) -> np.ndarray:
    """``keys``' distinct values, ascending (a sort and a comparison of neighbours: ``np.unique`` took ten
    times as long on 400 000 keys)."""
    keys = np.sort(keys)
    return keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if len(keys) else keys


def _unchecked_null(sel: exp.Select, unchecked: set[str]) -> exp.Select:
    """``sel`` (the capped columns of the reader) with each text column of ``unchecked`` NULL."""
    names = {view_column(c) for c in unchecked}
    items = [exp.alias_(exp.cast(exp.Null(), "VARCHAR"), e.alias_or_name, quoted=True) if e.alias_or_name in names
             else e for e in sel.expressions]
    return sel.select(*items, append=False)
