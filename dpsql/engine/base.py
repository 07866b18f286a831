"""What an execution backend is: the contract between dpsql's pipeline and the engine that runs SQL.

dpsql's front end (``dpsql.plan``) and rewrite layer (``dpsql.rewrite``) produce sqlglot ASTs;
a backend executes them. Adding an engine (say Spark) means one new module implementing the
two protocols below, and one entry in ``dpsql.engine.BACKENDS``:

* :class:`SqlOps` -- the *semantic building blocks* of bounded queries, built as sqlglot ASTs
  in the backend's own dialect: the keyed hash that makes every random choice
  (:meth:`SqlOps.keyed_hash`, and its uniform value :meth:`SqlOps.keyed_uniform`), keeping n rows per partition (:meth:`SqlOps.keep_n_per_partition`),
  clamping that keeps NULL (:meth:`SqlOps.clamp`), the cast that is NULL where it does not convert
  (:meth:`SqlOps.try_cast`), typed literals (:meth:`SqlOps.typed_literal`), seconds since 1970
  (:meth:`SqlOps.epoch_seconds`) and the smaller of two values (:meth:`SqlOps.least`). The
  rewrite layer composes its bounding steps from these only, so the privacy-relevant meaning of
  a bounded query (how many rows and groups each unit keeps, how they are chosen) is defined
  once, and each backend states how it is spelled. Each building block has a pure-Python
  reference in ``tests/test_backend_ops.py``; a new backend passes those tests by adding one
  fixture (same inputs, same outputs -- not merely SQL that renders).
* :class:`ExecutionBackend` -- registering a source as a private relation, binding
  (type-checking) a query without reading rows, fetching a query's result as Arrow under the
  owner's limits, post-processing released values, closing.

Why building blocks and not transpiling: sqlglot renders one AST for many dialects, but the
same function name can mean a different function. ``HASH(a)`` renders for Spark without any
complaint, as Spark's 32-bit Murmur3 hash, not DuckDB's 64-bit hash; ``ARG_MIN(x, h, 5)``
(five rows) has no Spark spelling, and lenient rendering turns it into ``MIN_BY`` (one row):
a silent change of sensitivity. So the hash and the row choice are operations each backend
implements, and every AST is rendered strictly (``dpsql.rewrite.render``): a construct the
target dialect cannot express is an error, and a building block made for one dialect is never
rendered for another.

Obligations of every backend (privacy, ``docs/threat_model.md``): error texts after data was
read are :func:`private_failure` (one text, whatever failed); binding reads schemas only;
sources are read totally (a value that cannot be read is NULL, never an error); the owner's
limits of :class:`EngineSettings` apply to every private read.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from sqlglot import exp

from dpsql.errors import ConfigError, ExecutionError, nearest_names

if TYPE_CHECKING:
    import pyarrow as pa

PRIVATE_FAILURE = "{what} failed while reading private data; the reason is withheld because it could depend on the data"


_SIZE = re.compile(r"^\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$", re.I)


#: the encodings a CSV source may be in (engine setting ``csv_encoding``)
CSV_ENCODINGS = ("utf-8", "latin-1")


@dataclass(frozen=True)
class EngineSettings:
    """Owner settings of the execution engine (``Session(engine=...)``, ``[engine]`` in dpsql.toml).

    They live with the data owner's configuration; no query option can change them.

    ``debug``: attach DuckDB's own (scrubbed) messages to errors as ``debug_detail``. UNSAFE:
        scrubbing is best effort, a message may still reveal something about a private value.
        For the data owner's own troubleshooting only, never on a deployment analysts query.
    ``memory_limit``: DuckDB memory limit for dpsql's queries, e.g. ``"4GB"`` (None: DuckDB's default, or a
        caller's connection's own). It must hold :func:`text_read_memory` of ``threads`` and ``max_text_bytes``
        (DuckDB engine): else a read of one person's longest texts fails after its charge, only when they are there.
    ``threads``: DuckDB threads for dpsql's queries (None: min(4, CPUs), lowered to what ``memory_limit`` holds
        with ``max_text_bytes``, at least 1; set explicitly, a ``memory_limit`` too small for it is refused).
    ``statement_timeout``: seconds a private read may run before it is interrupted (None: no limit).
        A time-out happens after the charge: the charge stands and the error is the generic one.
    ``min_response_time``: seconds every query that reads private data takes at least, padded by
        sleeping, failures included (0: no padding). Set it above the slowest expected query
        (and at least ``statement_timeout`` plus the release time) to hide run-time differences.
    ``max_temp_directory_size``: cap on DuckDB's spill files, e.g. ``"10GB"`` (None: DuckDB's default).
    ``temp_directory``: where DuckDB spills what does not fit ``memory_limit`` (None: a directory of
        its own per engine under the system's temporary directory, created on first spill and
        removed when the engine closes). With a memory limit and room to spill, a bounded query
        over any number of rows runs out of core instead of failing for memory. The engine's
        copies of CSV files (``dpsql.engine._duckdb_csv``) go there too, in a directory of their own.
    ``invalid_text``: how Parquet text that is not valid UTF-8 is read: ``"null"`` (default: the
        value is NULL; text is read as bytes through Arrow and decoded) or ``"replace"`` (each
        invalid byte becomes ``?``; DuckDB's own reader, faster, which refuses at registration
        the column types it cannot read totally, such as timestamps in milliseconds). Both are
        total: never an error. Arrow tables are always read the ``"null"`` way.
    ``csv_encoding``: the encoding of CSV files: ``"utf-8"`` (default: a line that is not valid UTF-8
        is skipped by every query alike) or ``"latin-1"`` (ISO-8859-1: every byte is a character, no
        line is skipped for its text). The engine's copy of each file version
        (``dpsql.engine._duckdb_csv``) decodes it so; the header line must decode too (else the
        registration is refused, naming this setting).
    ``kind``: the engine, a name in ``dpsql.engine.BACKENDS``: ``"duckdb"`` (default, embedded) or ``"spark"`` (``dpsql.engine.spark``;
        ``pip install 'dpsql[spark]'``).
    ``master``: Spark only: the master the backend starts its SparkSession on when the caller
        gives none (``"local[2]"`` by default, ``"spark://host:7077"`` for a standalone cluster).
    ``keyed_hash``: DuckDB only: ``"native"`` (its fast 64-bit hash) or ``"portable"`` (SHA-256 of
        canonical text, ``dpsql.engine.portable``: the same random choices as the Spark engine, so
        zero-noise results agree across engines). Spark always uses the portable hash.
    ``max_text_bytes``: a text or BLOB value of any source longer than this many bytes (UTF-8),
        a BIT value of more bits (its text, one character per bit, is what counts of distinct
        values list) or a GEOMETRY of a longer WKB, is read as NULL, also inside lists, structs and
        maps, so one hostile cell cannot make per-row functions arbitrarily slow (None: no cap). The check is on the stored length.
        Without a cap no ``memory_limit`` holds a vector of one person's longest texts: bound stored sizes in
        the writer (docs/threat_model.md, Residual risks).
    ``max_list_size``: a LIST, fixed-size ARRAY or MAP value (also inside a struct) whose size is over this is
        read as NULL (None: no cap), so one hostile cell cannot make counting its distinct values (which reads
        each as its text) arbitrarily slow. Its size is its elements at every depth (a list of lists counts the
        outer and the inner elements, a map its entries) plus the stored length of each text, BLOB, BIT (in
        bits) and GEOMETRY inside it: a list of 65 536 integers, or of 100 texts of 500 bytes, is within the
        default 65 536. It is measured from stored lengths, never by reading the value as text; a fixed-size
        ARRAY's size is its type's (every value of an ``INTEGER[100000]`` column is NULL).
    """

    debug: bool = False
    memory_limit: str | None = "4GB"
    threads: int | None = None
    statement_timeout: float | None = 300.0
    min_response_time: float = 0.0
    max_temp_directory_size: str | None = None
    temp_directory: str | None = None
    max_text_bytes: int | None = 65536
    max_list_size: int | None = 65536
    invalid_text: str = "null"
    csv_encoding: str = "utf-8"
    kind: str = "duckdb"
    master: str | None = None
    keyed_hash: str = "native"

    def __post_init__(self) -> None:
        from dpsql.engine import BACKENDS  # the engines by name (imported here: that module imports this one)

        if not isinstance(self.kind, str) or self.kind not in BACKENDS:
            names = sorted(repr(k) for k in BACKENDS)
            raise ConfigError(f"engine setting kind must be {', '.join(names[:-1])} or {names[-1]}, got {self.kind!r}",
                              hint='[engine] kind = "spark" (with pip install \'dpsql[spark]\')')
        if self.master is not None and (not isinstance(self.master, str) or not self.master.strip()):
            raise ConfigError(f"engine setting master must be a Spark master URL, got {self.master!r}",
                              hint='master = "local[2]" or "spark://host:7077"')
        if self.master is not None and self.kind != "spark":
            raise ConfigError("engine setting master is for kind = \"spark\" only", hint='[engine] kind = "spark"')
        if self.keyed_hash not in ("native", "portable"):
            raise ConfigError(f"engine setting keyed_hash must be 'native' or 'portable', got {self.keyed_hash!r}",
                              hint="portable: the hash Spark uses too (dpsql/engine/portable.py)")
        if self.csv_encoding not in CSV_ENCODINGS:
            raise ConfigError(f"engine setting csv_encoding must be 'utf-8' or 'latin-1', got {self.csv_encoding!r}",
                              hint='csv_encoding = "latin-1" for ISO-8859-1 files (a Windows-1252 file saved from a '
                                   'spreadsheet reads as Latin-1 but for 27 of its 256 bytes: save it as UTF-8)')
        if self.invalid_text not in ("null", "replace"):
            raise ConfigError(f"engine setting invalid_text must be 'null' or 'replace', got {self.invalid_text!r}",
                              hint='invalid_text = "null"')
        if not isinstance(self.debug, bool):
            raise ConfigError(f"engine setting debug must be true or false, got {self.debug!r}", hint="debug = false")
        for name in ("memory_limit", "max_temp_directory_size"):
            v = getattr(self, name)
            # DuckDB refuses a size of 2^64 bytes or more (on a caller's connection only as each read sets it)
            if v is not None and (not isinstance(v, str) or not _SIZE.match(v) or size_bytes(v) > _MOST_BYTES):
                raise ConfigError(f"engine setting {name} must be a size such as '4GB' (at most 1000000TB), "
                                  f"got {v!r}", hint=f"{name} = \"4GB\"")
        td = self.temp_directory
        if td is not None and (not isinstance(td, str) or not td.strip()):
            raise ConfigError(f"engine setting temp_directory must be a directory path, got {td!r}",
                              hint="temp_directory = \"/var/tmp/dpsql\"")
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise ConfigError(f"engine setting threads must be a whole number >= 1, got {t!r}", hint="threads = 4")
        st = self.statement_timeout
        if st is not None and (isinstance(st, bool) or not isinstance(st, (int, float)) or not st > 0 or st == float("inf")):
            raise ConfigError(f"engine setting statement_timeout must be a positive number of seconds, got {st!r}",
                              hint="statement_timeout = 300")
        for name in ("max_text_bytes", "max_list_size"):
            c = getattr(self, name)
            if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
                raise ConfigError(f"engine setting {name} must be a whole number >= 1, got {c!r}",
                                  hint=f"{name} = 65536")
        m = self.min_response_time
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not (0 <= m < float("inf")):
            raise ConfigError(f"engine setting min_response_time must be a number of seconds >= 0, got {m!r}",
                              hint="min_response_time = 0.5")
        self.read_threads()  # refused here when memory_limit cannot hold the longest texts' vectors (free)

    def read_settings(self) -> dict[str, Any]:
        """The settings that shape the rows a private read reads (part of each table's ``read_key``; ``csv_encoding``
        of a CSV source's only: it decides which lines are rows)."""
        return {"max_text_bytes": self.max_text_bytes, "max_list_size": self.max_list_size,
                "invalid_text": self.invalid_text, "csv_encoding": self.csv_encoding}

    @classmethod
    def from_dict(cls, d: Any) -> EngineSettings:
        if d is None:
            return cls()
        if isinstance(d, EngineSettings):
            return d
        if not isinstance(d, dict):
            raise ConfigError("[engine] settings must be a table / dict", hint="[engine] statement_timeout = 300")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown engine setting(s) {unknown}{nearest_names(unknown, sorted(known))}",
                              hint=f"known: {sorted(known)}")
        return cls(**d)

    @property
    def effective_threads(self) -> int:
        """The threads of a private read under ``memory_limit`` (:meth:`read_threads`)."""
        return self.read_threads()

    def read_threads(self, limit: int | None = None, whose: str | None = None) -> int:
        """The threads of a private read on the DuckDB engine under a memory limit of ``limit`` bytes (default:
        ``memory_limit``; ``whose`` names where a ``limit`` given comes from, for the refusal): ``threads``, or when
        unset min(4, CPUs) lowered until ``limit`` holds :func:`text_read_memory` (at least 1). A ConfigError (free)
        where even that does not hold. No limit known, no text cap, or another engine: no bound."""
        default = self.threads if self.threads is not None else max(1, min(4, os.cpu_count() or 1))
        if limit is None and self.memory_limit is not None:
            limit, whose = size_bytes(self.memory_limit), None
        cap = self.max_text_bytes
        if limit is None or cap is None or self.kind != "duckdb":
            return default
        n = default if self.threads is not None else max(1, min(default, limit // text_read_memory(1, cap)))
        need = text_read_memory(n, cap)
        if need <= limit:
            return n
        most = limit // text_read_memory(n, 1)
        fits = f"at most {most}" if most >= 1 else "none fits"
        where = f"memory_limit = {self.memory_limit!r}" if whose is None else f"{whose} ({_mb(limit)})"
        threads = f"threads = {n}" if self.threads is not None else "threads = 1 (lowered from its default)"
        raise ConfigError(
            f"engine settings {where}, {threads} and max_text_bytes = {cap} leave too little memory to read the "
            f"longest texts: DuckDB's Parquet reader decodes {READ_VECTOR_ROWS} rows per vector and needs up to "
            f"{TEXT_VECTORS_PER_THREAD} such vectors per thread, {_mb(need)} here, so a query over one person's "
            "texts of that length would fail after its charge, only when that person is there; nothing was charged",
            hint=f'raise memory_limit to at least "{-(-need // 10**6)}MB", or lower max_text_bytes '
                 f"({fits} at {n} thread{'s' * (n > 1)})" + (" or threads" if n > 1 else "")
                 + ' ([engine] memory_limit = "..." in dpsql.toml, or Session(engine={"memory_limit": ...}))')


#: the rows of one vector of DuckDB's Parquet reader (DuckDB's STANDARD_VECTOR_SIZE)
READ_VECTOR_ROWS = 2048
#: vectors of the longest texts (``max_text_bytes`` each) one reading thread needs within ``memory_limit``, with a
#: margin. Measured on DuckDB 2.0.1 (the least limit, to 2 %, under which ``COUNT(*) ... WHERE note LIKE '%x%'``
#: with a row cap answers over row groups of 6 144 plain zstd texts of one length, 2 shared cores): one thread, 4 to
#: 32 row groups of 65 536-byte texts, 538-545 MB (4.0-4.1 vectors; ``COUNT(note)``, ``COUNT(DISTINCT note)`` and
#: ``GROUP BY note`` alike); two threads 818 MB over 4 row groups, 1 348 MB over 16 (5.0 per thread); three 2 097 MB
#: over 16 (5.2); four threads 1 037-1 083 MB over 4, 2 658 MB over 16 (5.0 per thread). Texts of 8 192, 16 384,
#: 32 768, 49 152 and 100 000 bytes needed fewer vectors at one thread (35, 70, 135, 135 and 538 MB: 2.1, 2.1, 2.0, 1.3
#: and 2.6 vectors). Six per thread: 805 MB a thread at the default cap, so the default 4 GB holds 4 threads.
TEXT_VECTORS_PER_THREAD = 6


def text_read_memory(threads: int, max_text_bytes: int) -> int:
    """Bytes of ``memory_limit`` under which DuckDB reads one person's rows of texts of ``max_text_bytes`` with
    ``threads`` threads: :data:`TEXT_VECTORS_PER_THREAD` vectors of :data:`READ_VECTOR_ROWS` such texts per thread."""
    return TEXT_VECTORS_PER_THREAD * threads * READ_VECTOR_ROWS * max_text_bytes


#: the largest size setting taken (DuckDB reads sizes below 2^64 bytes)
_MOST_BYTES = 10**18
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def size_bytes(text: str) -> int:
    """The bytes of a size setting (``"4GB"``; KB, MB, GB, TB in powers of 1000 and KiB ... TiB in powers of 1024,
    as DuckDB reads them)."""
    m = _SIZE.match(text)
    if m is None:
        raise ConfigError(f"{text!r} is not a size such as '4GB'")
    return int(Decimal(text.strip()[:-len(m.group(2))].strip()) * _UNITS[m.group(2).lower()])


def _mb(n: int) -> str:
    return f"{n / 10**6:,.0f} MB".replace(",", " ")


def scrub(text: str) -> str:
    """DuckDB's message for the owner's debug mode: first line only, quoted literals and numbers
    removed, capped in length. Best effort: the debug mode stays unsafe."""
    first = str(text).strip().splitlines()[0] if str(text).strip() else ""
    first = re.sub(r"'(?:[^']|'')*'?", "'?'", first)
    first = re.sub(r'"(?:[^"]|"")*"?', '"?"', first)
    first = re.sub(r"\\x[0-9A-Fa-f]{2}", "", first)
    first = re.sub(r"[-+]?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?", "#", first)
    first = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in first)
    return first[:240]




def with_read_salt(ast: Any) -> Any:
    """``ast`` with a fresh secret in place of every literal the typer marked as the read salt
    (``dpsql.plan.typer.READ_SALT``: the salt of a long IN list's digests), drawn for this one private
    read and never shown (explain and the bind check keep the marker literal). ``ast`` itself is unchanged."""
    import secrets

    from sqlglot import exp

    from dpsql.plan.typer import READ_SALT

    if not any(n.meta.get(READ_SALT) for n in ast.find_all(exp.Literal)):
        return ast
    out = ast.copy()
    salt = secrets.token_hex(16)
    for n in list(out.find_all(exp.Literal)):
        if n.meta.get(READ_SALT):
            n.set("this", salt)
    return out


def read_salted_text(ast: Any, text: str, salt: str | None = None) -> str | None:
    """The text of ``with_read_salt(ast)`` (under ``salt``, or a fresh secret) from ``text``, the text of ``ast`` itself
    as DuckDB's renderer gives it without a pretty layout (a literal's text does not change how the rest is laid out):
    each quoted placeholder of the read salt in ``text`` replaced by the secret, where every one of them is one of
    the salt's literals (as many in the text as the tree has, each holding the placeholder, whose text is its own
    quoted). None where ``ast`` has no read salt or that does not hold: the tree is then salted and rendered. A long
    IN list's text is then rendered once for the bind check and its read, not twice (a copy of the tree each time)."""
    import secrets

    from sqlglot import exp

    from dpsql.plan.typer import READ_SALT

    marked = [n for n in ast.find_all(exp.Literal) if n.meta.get(READ_SALT)]
    if not marked or any(not n.is_string or n.this != READ_SALT for n in marked):
        return None
    quoted = f"'{READ_SALT}'"
    if text.count(quoted) != len(marked):  # (a literal or a name of the query spelling it too: rendered anew)
        return None
    secret = secrets.token_hex(16) if salt is None else salt
    if not re.fullmatch(r"[0-9a-f]+", secret):  # pragma: no cover - the salt is hex: its text is itself, quoted
        return None
    return text.replace(quoted, f"'{secret}'")


def private_failure(what: str, detail: str | None, settings: EngineSettings) -> ExecutionError:
    """The one error for any failure after data was read: the text depends on public settings only."""
    limits = []
    if settings.statement_timeout is not None:
        limits.append(f"statement time-out {settings.statement_timeout:g} s")
    if settings.memory_limit is not None:
        limits.append(f"memory limit {settings.memory_limit}")
    return ExecutionError(
        PRIVATE_FAILURE.format(what=what[:1].upper() + what[1:]),
        hint="possible causes: the owner's limits (" + (", ".join(limits) or "none set")
        + "), a full temp directory, a source file damaged or replaced while it was read, or a bug. Simplify the "
        "query or ask the data owner, who can "
        "reproduce it with the engine's debug mode (unsafe: see docs/threat_model.md)",
        debug_detail=detail,
    )




def view_column(name: str) -> str:
    """The name under which a source's column appears in its private relation: the catalog's
    (Python's Unicode lower case). Queries are resolved against lower-cased names, and DuckDB folds
    only ASCII letters when it matches an identifier, so a column such as ``Ärger`` must be exposed
    as ``ärger`` for ``"Ärger"``, ``Ärger`` and ``ärger`` to reach it alike."""
    return name.lower()


def source_name(table: str) -> str:
    """The default name of a registered source's private relation."""
    return f"_dpsql_src_{table}"


#: meta key of a table node standing for a long public key domain (:class:`DomainRelation`)
DOMAIN_RELATION = "dpsql_domain_relation"


@dataclass(frozen=True, eq=False)
class DomainRelation:
    """A public key domain (catalog metadata, never data) that a backend registers as a relation of its own for
    one query (one column ``__d`` of the values, typed to the column), instead of one literal per value in the
    SQL text: the meta of a placeholder table node (``DOMAIN_RELATION``), made where the ops set
    ``domain_relation_min`` (``dpsql.rewrite.bound.domain_rows``). Shared, never copied, by copies of the tree."""

    values: tuple[Any, ...]
    column_type: str

    def __deepcopy__(self, memo: Any) -> DomainRelation:
        return self


@functools.lru_cache(maxsize=256)
def _parsed_type(name: str, dialect: str | None) -> exp.DataType:
    return exp.DataType.build(name, dialect=dialect)


def data_type(name: str, dialect: str | None = None) -> exp.DataType:
    """``exp.DataType.build(name, dialect=dialect)``, parsed once per name: sqlglot parses a type's
    text anew on every call (a parser run each: about a third of the time spent building a
    bounded query went to ``DOUBLE``, ``BIGINT``, ``VARCHAR`` and ``HUGEINT``). A fresh copy each
    time, as ``build`` returns (a node belongs to one tree)."""
    return _parsed_type(name, dialect).copy()


def power_of_two_factors(k: int) -> tuple[int, ...]:
    """Exponents summing to ``k``, each within a DOUBLE's normal range (2^k itself may not be)."""
    return (k,) if abs(k) <= 1000 else (k // 2, k - k // 2)


#: the declarations every building-block class makes itself (:class:`DeclaredOps`): no default, because
#: the safe answer differs by engine and a default would be the unsafe one for some engine
REQUIRED_DECLARATIONS = ("keyed_hash_is_digest", "text_digest")


def check_declarations(cls: type) -> None:
    """Refuse (``TypeError``) a building-block class whose hashes do not say how they read a salted text
    (``dpsql.rewrite.bound.spread_input``, ``docs/threat_model.md``):

    * ``keyed_hash_is_digest`` (a bool): whether :meth:`SqlOps.keyed_hash` is a digest of its input's
      text (SHA-256: a salted text enters it as it is) or the engine's own hash (which must read the
      salted text through ``text_digest``);
    * ``text_digest``: how the engine's own hash (its hash tables, ``list_distinct``, ``spread_hash``)
      reads a salted text: a method ``text_digest(text) -> digest expression``, or ``None`` where the
      engine's hash reads it as it is.

    Both are read from the class only (public), and a class that defines a hash declares them in its
    own body, so a subclass that changes the hash cannot inherit its parent's answer by accident.
    Called when the class is created (:class:`DeclaredOps`), so a backend without them fails at import,
    never per query."""
    name = cls.__qualname__
    missing = [d for d in REQUIRED_DECLARATIONS
               if not any(d in vars(k) for k in cls.__mro__ if k is not DeclaredOps and k is not object)]
    if missing:
        raise TypeError(f"building blocks {name} do not declare {', '.join(missing)}: say how its hashes read a "
                        "key's salted text (keyed_hash_is_digest = True only for a digest such as SHA-256; "
                        "text_digest = a digest method, or None where the engine's own hash reads the text as it is)")
    for hashes, declaration in ((("keyed_hash", "keyed_hash_of", "keyed_uniform", "exponential_clock"), "keyed_hash_is_digest"),
                                (("spread_hash",), "text_digest")):
        defined = [h for h in hashes if h in vars(cls)]
        if defined and declaration not in vars(cls):
            raise TypeError(f"building blocks {name} define {defined[0]} but do not declare {declaration} "
                            "in the same class: a changed hash restates how it reads a salted text")
    digest = cls.keyed_hash_is_digest  # type: ignore[attr-defined]
    if not isinstance(digest, bool):
        raise TypeError(f"building blocks {name}: keyed_hash_is_digest must be True or False, got {digest!r}")
    text = cls.text_digest  # type: ignore[attr-defined]
    if text is not None and not callable(text):
        raise TypeError(f"building blocks {name}: text_digest must be a method or None, got {text!r}")
    if not digest and text is None:
        raise TypeError(f"building blocks {name}: keyed_hash is the engine's own hash (keyed_hash_is_digest = "
                        "False), so it needs a text_digest to read a salted text through")


class DeclaredOps:
    """The base of every building-block class (:class:`SqlOps`): a subclass is checked by
    :func:`check_declarations` when it is created."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_declarations(cls)


def text_digest_of(ops: object) -> Callable[[exp.Expression], exp.Expression] | None:
    """``ops.text_digest``, read strictly: building blocks that do not derive from :class:`DeclaredOps`
    are checked here (``TypeError``), never taken to need no digest."""
    if not isinstance(ops, DeclaredOps):
        check_declarations(type(ops))
    return cast("Callable[[exp.Expression], exp.Expression] | None", ops.text_digest)  # type: ignore[attr-defined]


@runtime_checkable
class SqlOps(Protocol):
    """The semantic building blocks of bounded queries, as sqlglot ASTs in one dialect.

    Every expression a method returns is rendered for :attr:`dialect` only (strict rendering
    refuses it for any other dialect: ``dpsql.rewrite.render``). Column arguments are names of
    columns of the relation the expression is evaluated on.
    """

    #: the sqlglot dialect the building blocks are written in (and the backend renders with)
    dialect: str
    @property
    def keyed_hash_is_digest(self) -> bool:
        """Whether :meth:`keyed_hash` is a digest of its input's text (a class attribute, declared by every
        class: :func:`check_declarations`; no default)."""
        ...

    @property
    def text_digest(self) -> Callable[[exp.Expression], exp.Expression] | None:
        """How the engine's own hash reads a salted text: a digest method, or None (declared by every
        class: :func:`check_declarations`; no default). Read it through :func:`text_digest_of`."""
        ...

    def keyed_hash(self, columns: Sequence[str], salt: str) -> exp.Expression:
        """A pseudo-random sort key of the given columns under a secret ``salt``: over rows with
        distinct column values it is (as far as any test can tell) uniform and independent, and
        independent across salts. Never NULL (a NULL column value hashes like any value).
        The salt is a secret string; the backend may derive a fixed-width key from it (the
        meaning is a keyed pseudo-random order, not any one hash function)."""
        ...

    def keyed_uniform(self, columns: Sequence[str], salt: str) -> exp.Expression:
        """A pseudo-random DOUBLE strictly inside (0, 1) of the given columns under a secret
        ``salt``, uniform and independent over rows with distinct column values, as
        :meth:`keyed_hash` (an exponential race, ``-LN(u) / weight``, makes a weighted choice
        from it)."""
        ...

    def exponential_clock(self, columns: Sequence[str], salt: str) -> exp.Expression:
        """``-LN(keyed_uniform(columns, salt))``: a keyed Exp(1) draw (finite: the uniform is never
        0 or 1); divided by a weight it races the rows of an exponential-race choice."""
        ...

    def row_clock(self) -> exp.Expression | None:
        """A fresh uniform draw per *row* from the engine's own generator (seeded from OS
        entropy, independent of the data and of every other row's draw), or None when the
        backend's choices must be reproducible from the salt (the portable hash that Spark and
        DuckDB share): then a one-row choice races the distinct values weighted by their counts
        (``dpsql.rewrite.bound._pick_one_row``). Identical rows get distinct draws, so the row
        with the smallest draw is uniform over the rows with one aggregate and no counting. Only
        for a generator nobody else can seed (DuckDB: a connection the engine opened itself)."""
        ...

    def keep_n_per_partition(self, relation: exp.Expression, partition: Sequence[str], order_key: exp.Expression,
                             n: int, *, alias: str, output: Sequence[str] | None = None) -> exp.Subquery:
        """The rows of ``relation`` (a subquery), at most ``n`` per partition: those with the
        smallest ``order_key`` (an expression over the relation's columns, never NULL, e.g. a
        :meth:`keyed_hash`). Which rows a partition keeps depends only on that partition's
        rows. The result is a subquery named ``alias`` with every column of ``relation``
        (``output=None``) or exactly the columns ``output`` (partition columns may be left out).
        """
        ...

    def clamp(self, value: exp.Expression, lo: float, hi: float, *, shift: float = 0.0) -> exp.Expression:
        """A numeric ``value`` clamped into [lo, hi] (minus ``shift``); NULL stays NULL (SQL
        aggregates skip it); -inf is lo, +inf is hi, NaN is hi (NaN sorts above every number)."""
        ...

    def try_cast(self, value: exp.Expression, to: str) -> exp.Expression:
        """``value`` converted to type ``to`` (a DuckDB type name), NULL where it does not
        convert: never an error (guarded evaluation: whether a query fails must not depend on a
        row). ``dpsql.plan.typer`` renders this same cast (``TRY_CAST``) in the front end."""
        ...

    def typed_literal(self, value: Any, to: str) -> exp.Expression:
        """A constant of type ``to`` whose value is exactly ``value`` (int, float, Decimal, str,
        bool, date, datetime; None: a NULL of that type): text is quoted, never parsed as SQL."""
        ...

    def epoch_seconds(self, value: exp.Expression) -> exp.Expression:
        """Seconds since 1970-01-01 00:00:00 of a TIMESTAMP, as DOUBLE with its fraction."""
        ...

    def epoch_micros(self, value: exp.Expression) -> exp.Expression:
        """Microseconds since 1970-01-01 00:00:00 of a TIMESTAMP, as BIGINT: exact, where the DOUBLE of
        :meth:`epoch_seconds` has a spacing of 2.4e-7 s around 2026."""
        ...

    def least(self, a: exp.Expression, b: exp.Expression) -> exp.Expression:
        """The smaller of two values that are never NULL (engines differ on NULL arguments)."""
        ...

    def fixed_point(self, value: exp.Expression, scale: int) -> exp.Expression:
        """A DOUBLE ``value`` with ``|value| * 2^scale < 2^53`` as the integer ``value * 2^scale``
        truncated toward zero (so its magnitude never grows), of an integer type whose
        :meth:`exact_sum` is exact; NULL stays NULL. ``dpsql.rewrite.bound.fixed_point_scale``."""
        ...

    def exact_sum(self, value: exp.Expression) -> exp.Expression:
        """``SUM`` of :meth:`fixed_point` integers (or of such sums), computed exactly (an integer
        type of at least 126 bits): no rounding, whatever the order of the rows."""
        ...

    def from_fixed_point(self, total: exp.Expression, scale: int) -> exp.Expression:
        """An exact integer ``total`` back to DOUBLE: ``CAST(total AS DOUBLE) * 2^-scale``, one
        conversion (the multiplications by powers of two are exact)."""
        ...

    def scaled_integer(self, value: exp.Expression, scale: int) -> exp.Expression:
        """An integer or DECIMAL(p, ``scale``) ``value`` (``scale`` <= 19) times 10^scale, exactly, as an integer
        of at least 126 bits (HUGEINT, DECIMAL(38, 0)): no value of the type overflows or raises; NULL stays NULL."""
        ...

    def bernoulli_keep(self, columns: Sequence[str], salt: str, q: float) -> exp.Expression:
        """A condition true with probability ``floor(q * 2^52) / 2^52`` (<= q) per row, decided by a
        keyed cryptographic hash (SHA-256) of ``salt`` and the rows' ``columns`` (which must be
        distinct across rows): independent across rows and across salts, unpredictable without
        the salt (a computational claim: SHA-256 as a pseudo-random function of the salt).
        Every engine must compute the same hash of the same text, so the sample is the same."""
        ...


class CodedKeyOps(Protocol):
    """Optional building blocks (DuckDB's): a text group key of a small public domain carried
    through the bounding as its position in the domain. A backend offers them when
    :func:`coded_key_ops` says so; Spark and the portable hash keep text keys."""

    #: the largest public domain coded (0: none); at most 63, one BIGINT bit per value
    coded_domain_max: int

    def domain_code(self, key: exp.Expression, values: Sequence[str]) -> exp.Expression:
        """The key's position in ``values`` (NULL outside them, by exact spelling)."""
        ...

    def domain_text(self, code: exp.Expression) -> exp.Expression:
        """The domain value (text) of a :meth:`domain_code`."""
        ...

    def keyed_hash_of(self, values: Sequence[exp.Expression], salt: str) -> exp.Expression:
        """:meth:`SqlOps.keyed_hash` of expressions (a coded key's :meth:`domain_text`)."""
        ...

    def count_units_by_mask(self, relation: exp.Expression, key: str, values: Sequence[str], n: int,
                            salt: str) -> exp.Select:
        """The per-unit group cap ``n`` and the count of units per group of one coded key, in one pass
        (columns ``key`` and ``__users``)."""
        ...


def coded_key_ops(ops: object) -> CodedKeyOps | None:
    """``ops`` as :class:`CodedKeyOps` when it codes any key (``coded_domain_max`` > 0), else None.
    From the backend's class only: public. (A subclass may switch the one-pass mask plan off by
    setting ``count_units_by_mask`` to None and keep coded keys.)"""
    if getattr(ops, "coded_domain_max", 0) > 0:
        return cast(CodedKeyOps, ops)
    return None


@runtime_checkable
class ExecutionBackend(Protocol):
    """An engine that executes dpsql's ASTs (the DuckDB one: ``dpsql.engine.duckdb``).

    Every method takes sqlglot ASTs (never SQL text) and renders them itself, strictly, for
    :attr:`dialect`.

    Besides these, the core calls, where they apply (an engine without one is refused there, never taken
    to have nothing to report): ``source_changed(view) -> str | None`` (before every charge on a Parquet
    or CSV table: what changed in its files since registration, or None) and ``reading_scans(ast) ->
    list[str]`` (a table of the caller's DuckDB connection: the scans it now reads that are not DuckDB
    tables). Optional: ``check_connection()`` (the caller's connection can run a private read),
    ``prepare_bounded(build, salt)`` (``dpsql.engine.bounded_under``) and ``_detail(exception)`` (the
    owner's debug mode: the engine's scrubbed message; else the exception's class).
    """

    settings: EngineSettings
    dialect: str
    ops: SqlOps

    def render(self, ast: exp.Expression, *, pretty: bool = False) -> str:
        """The SQL text this backend would run for ``ast`` (for ``explain``), rendered strictly
        for :attr:`dialect`; UnsupportedQueryError if the dialect cannot express it."""
        ...

    def register_source(self, name: str, kind: str, source: Any, view: str | None = None,
                        types: dict[str, str] | None = None) -> dict[str, str]:
        """Expose a source as a private relation named ``view`` (default :func:`source_name`),
        read totally; returns its public schema (lower-case column -> DuckDB type name). Reads
        schemas (and a CSV header line) only, never a data row. Raises ConfigError."""
        ...

    def unregister_source(self, name: str, kind: str, view: str | None = None) -> None:
        """Drop a registered source's relation (no error if it is gone)."""
        ...

    def describe(self, ast: exp.Expression) -> list[tuple[str, str]]:
        """(column, type) of a query's result, by binding it only (no row is read)."""
        ...

    def bind_check(self, ast: exp.Expression, *, run: bool = False) -> None:
        """Bind a query without reading a row (``run=True``: run it, for queries over public
        placeholder relations only); QueryTypeError if it does not bind. Renders the query, so
        a construct the dialect cannot express is refused here, before any charge."""
        ...

    def fetch_arrow(self, ast: exp.Expression, *, what: str = "the bounded query",
                    deadline: float | None = None) -> pa.Table:
        """Run a query over private data under the owner's limits; any failure is
        :func:`private_failure`. ``deadline``: a ``time.monotonic()`` instant the read must not run past
        (a batch's shared statement time-out), besides the owner's ``statement_timeout``."""
        ...

    def post_process(self, table: pa.Table, ast_builder: Callable[[str], exp.Expression]) -> pa.Table:
        """Run ``ast_builder(name)`` over ``table`` (released values only) registered as ``name``."""
        ...

    def close(self) -> None:
        ...


@dataclass(frozen=True)
class BoundedBatch:
    """Several bounded queries of one request, run one after another on the same backend: a join query
    with several aggregates answers each by its own mechanism run (``dpsql.mechanisms.join_multi``).
    Each is rendered, bound and read as a query of its own; the release gets their results in order."""

    queries: tuple[exp.Expression, ...]


def literal_text(value: Any) -> str:
    """The text a typed literal casts from, the same on every backend: integers and decimals
    exactly, floats as their shortest round-trip text (inf, nan too), dates and timestamps in
    ISO form, text as it is (the renderer quotes it)."""
    import datetime as dt
    import decimal

    if isinstance(value, bool):
        raise TypeError("booleans are literals of their own")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise ValueError(f"a DECIMAL literal must be finite, got {value!r}")
        return format(value, "f")
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, str):
        return value
    raise TypeError(f"no typed literal for a {type(value).__name__} value")
