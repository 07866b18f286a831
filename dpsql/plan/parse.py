"""Parsing user SQL with sqlglot (DuckDB dialect), with positions for error messages."""

from __future__ import annotations

import bisect
import logging
import os
import re
from functools import lru_cache

import sqlglot
from sqlglot import ErrorLevel, exp
from sqlglot.expressions import SQLGLOT_META
from sqlglot.tokens import Token, TokenType

from dpsql.errors import SQLSyntaxError, UnsupportedQueryError, Violation

DIALECT = "duckdb"

#: words that may open a JOIN clause (scanned backwards from the joined table)
_JOIN_WORDS = {
    "JOIN", "LEFT", "RIGHT", "FULL", "INNER", "OUTER", "CROSS", "NATURAL", "POSITIONAL", "ASOF",
    "SEMI", "ANTI", "LATERAL", ",",
}
_QUERY_STARTS = {"SELECT", "FROM", "WITH", "VALUES", "("}
_TOKEN_REPR = re.compile(r"<Token token_type: TokenType\.(\w+), text: (.*?), line: \d+, col: \d+, start: \d+, end: \d+, comments: \[.*?\]>")


def _raised_outside_sqlglot(e: BaseException) -> BaseException | None:
    """The exception a signal's handler of the program raised while sqlglot's tokenizer ran (a SIGALRM time-out), which
    the tokenizer wraps, as any exception of its scan, in a TokenError: the valid query was called 'SQL syntax error:
    the SQL cannot be split into tokens' and the program's exception lost. Known by the frame it was raised in, the
    handler's own, outside sqlglot (also where it came through unwrapped); None for the tokenizer's own errors."""
    cause = e if not isinstance(e, sqlglot.errors.SqlglotError) else e.__cause__
    if cause is None or isinstance(cause, sqlglot.errors.SqlglotError):
        return None
    tb = cause.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    where = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return None if where.startswith(os.path.dirname(os.path.abspath(sqlglot.__file__)) + os.sep) else cause


@lru_cache(maxsize=64)
def _line_starts(sql: str) -> tuple[int, ...]:
    return (0, *(i + 1 for i, ch in enumerate(sql) if ch == "\n"))


def line_col(sql: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of a character offset (a search of the query's line starts, found once: a
    message for each of many calls never counts the lines before it again)."""
    offset = max(0, min(offset, len(sql)))
    line = bisect.bisect_right(_line_starts(sql), offset)
    return line, offset - _line_starts(sql)[line - 1] + 1


def line_text(sql: str, line: int) -> str:
    """The text of 1-based ``line`` of ``sql`` ('' past its end)."""
    starts = _line_starts(sql)
    if not 1 <= line <= len(starts):
        return ""
    end = starts[line] - 1 if line < len(starts) else len(sql)
    return sql[starts[line - 1]:end]


@lru_cache(maxsize=64)
def tokens(sql: str) -> tuple[Token, ...]:
    """The tokens of ``sql`` (empty if it does not tokenize)."""
    try:
        return tuple(sqlglot.tokenize(sql, read=DIALECT))
    except Exception as e:  # parse errors are reported elsewhere
        foreign = _raised_outside_sqlglot(e)
        if foreign is not None:  # (a signal's handler: never remembered as the text's tokens, none)
            raise foreign from None
        return ()


def statement_starts(sql: str) -> list[int]:
    """Character offsets of the first token of every statement in ``sql``."""
    starts: list[int] = []
    expect = True
    for t in tokens(sql):
        if t.token_type == TokenType.SEMICOLON:
            expect = True
            continue
        if expect:
            starts.append(t.start)
            expect = False
    return starts


@lru_cache(maxsize=64)
def _token_starts(sql: str) -> tuple[int, ...] | None:
    """The start of every token of ``sql`` in order (``None`` if they are not in order)."""
    starts = tuple(t.start for t in tokens(sql))
    return starts if all(a <= b for a, b in zip(starts, starts[1:])) else None


def _last_token_at(sql: str, offset: int) -> int:
    """Index of the last token of ``sql`` that starts at or before ``offset`` (-1 if none): a search, not a
    scan of every token (a position for each of n calls scanned the query n times)."""
    starts = _token_starts(sql)
    if starts is None:  # pragma: no cover - the tokenizer gives its tokens in order
        return max((k for k, t in enumerate(tokens(sql)) if t.start <= offset), default=-1)
    return bisect.bisect_right(starts, offset) - 1


def keyword_offset(sql: str, words: set[str], *, after: int = 0, depth0: bool = True) -> int | None:
    """Offset of the first token (at parenthesis depth 0 if ``depth0``) whose text is in ``words``."""
    depth = 0
    for t in tokens(sql):
        if t.start < after:
            continue
        if t.token_type == TokenType.L_PAREN:
            depth += 1
        elif t.token_type == TokenType.R_PAREN:
            depth -= 1
        if t.text.upper() in words and (depth == 0 or not depth0):
            return t.start
    return None


def _valid_meta(sub: exp.Expr, sql: str) -> int | None:
    meta = getattr(sub, "_meta", None) or {}
    start = meta.get("start") if isinstance(meta, dict) else None
    if start is None or not (0 <= start < len(sql)):
        return None
    end = meta.get("end")
    text = sql[start : (end if isinstance(end, int) else start) + 1]
    # nodes that the parser synthesises (e.g. the * of DuckDB's FROM-first syntax) carry
    # a token position that does not spell them: ignore those
    if isinstance(sub, exp.Star) and text != "*":
        return None
    if isinstance(sub, exp.Identifier) and text.strip("\"`'").lower() != sub.name.lower():
        return None
    return int(start)


def _anchor(node: exp.Expression, sql: str) -> int | None:
    best: int | None = None
    for sub in node.walk():
        s = _valid_meta(sub, sql)
        if s is not None and (best is None or s < best):
            best = s
    return best


#: nodes with more descendants than this are never rendered for a message (rendering copies the whole tree:
#: a 10 000-term AND chain took seconds per message); their fragment is the query's own text
BIG_NODE = 2000


def is_big(node: exp.Expression) -> bool:
    """Whether ``node`` has more than :data:`BIG_NODE` descendants (a walk that stops there)."""
    for i, _ in enumerate(node.walk()):
        if i > BIG_NODE:
            return True
    return False


def _lead_word(node: exp.Expression, rendered: str | None = None) -> str:
    if rendered is None:
        if is_big(node):
            return ""
        try:
            rendered = node.sql(dialect=DIALECT, unsupported_level=ErrorLevel.IGNORE)
        except Exception:  # pragma: no cover - defensive
            return ""
    m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", rendered)
    return m.group(1).upper() if m else ""


def _offset(node: exp.Expression, sql: str, rendered: str | None = None) -> int | None:
    anchor = _anchor(node, sql)
    if anchor is None:
        return None
    toks = tokens(sql)
    i = _last_token_at(sql, anchor)
    if i < 0:
        return anchor
    if isinstance(node, (exp.Subquery, exp.Exists)) or (
        isinstance(node, exp.Join) and isinstance(node.this, (exp.Subquery, exp.Lateral))
    ):
        # walk back to the unmatched '(' that opens a query: '(' SELECT / FROM / WITH / VALUES
        depth = 0
        for j in range(i - 1, -1, -1):
            t = toks[j]
            if t.token_type == TokenType.R_PAREN:
                depth += 1
            elif t.token_type == TokenType.L_PAREN:
                if depth == 0:
                    if j + 1 < len(toks) and toks[j + 1].text.upper() in _QUERY_STARTS:
                        i = j
                        break
                else:
                    depth -= 1
        if isinstance(node, exp.Exists) and i > 0 and toks[i - 1].text.upper() == "EXISTS":
            i -= 1
    if isinstance(node, exp.Join):
        while i > 0 and toks[i - 1].text.upper() in _JOIN_WORDS:
            i -= 1
        return toks[i].start
    if isinstance(node, (exp.Func, exp.Window, exp.Filter, exp.Cube, exp.Rollup, exp.GroupingSets)):
        lead = _lead_word(node, rendered)
        for j in range(i, max(-1, i - 16), -1):
            if toks[j].text.upper() == lead:
                return toks[j].start
        # another spelling of the function (e.g. list for ARRAY_AGG): the name before the '('
        if i >= 2 and toks[i - 1].token_type == TokenType.L_PAREN:
            return toks[i - 2].start
    return toks[i].start


#: meta key: the node as the query wrote it, set on a node that the analysis puts in its place: the merge of views
#: (``dpsql.plan.views``: a view's expression for the column naming it, a column qualified or renamed, a view's
#: tables for its name) and a join's flat column names (``dpsql.plan.joins``: ``a__x`` for ``a.x``)
WRITTEN = "dpsql_written"


def original(node: exp.Expression) -> exp.Expression:
    """``node`` as the query wrote it (a copy, without the mark)."""
    meta = node._meta
    if meta is not None and WRITTEN in meta:
        return meta[WRITTEN]  # type: ignore[no-any-return]
    out = node.copy()
    if out._meta is not None:
        out._meta.pop(WRITTEN, None)
    return out


def stands_for(new: exp.Expression, old: exp.Expression) -> exp.Expression:
    """``new``, marked as standing where the query wrote ``old``: a message quotes and places ``old``
    (``dpsql.plan.parse.as_written``), never the merged text."""
    new.meta[WRITTEN] = original(old)
    return new


def carry_written(new: exp.Expression, old: exp.Expression) -> exp.Expression:
    """``new``, with ``old``'s :data:`WRITTEN` mark if it has one (a node rebuilt from a marked one)."""
    if old._meta is not None and WRITTEN in old._meta:
        new.meta[WRITTEN] = old._meta[WRITTEN]
    return new


def _has_written(node: exp.Expression) -> bool:
    return any(sub._meta is not None and WRITTEN in sub._meta for sub in node.walk())


def as_written(node: exp.Expression) -> exp.Expression:
    """``node`` as the query wrote it: ``node`` itself, or a copy with every part marked :data:`WRITTEN` put back
    as written (a view's column instead of the view's expression, a column as qualified in the query), so that
    a message quotes the query's own text at its own position, never the merged text."""
    if not _has_written(node):
        return node
    if node._meta is not None and WRITTEN in node._meta:
        return as_written(node._meta[WRITTEN])
    out = node.copy()
    stack: list[exp.Expression] = [out]
    while stack:
        sub = stack.pop()
        for child in list(sub.iter_expressions()):
            if child._meta is not None and WRITTEN in child._meta:
                child.replace(as_written(child._meta[WRITTEN]).copy())
            else:
                stack.append(child)
    return out


def quoted(node: exp.Expression) -> str:
    """``node``'s text for a message: as the query wrote it (:func:`as_written`), in DuckDB's dialect."""
    return as_written(node).sql(dialect=DIALECT, unsupported_level=ErrorLevel.IGNORE)


def position(node: exp.Expression, sql: str, rendered: str | None = None) -> tuple[int, int]:
    """Best-effort 1-based (line, column) where ``node`` starts in ``sql`` (0, 0 if unknown).

    sqlglot records token positions on leaves (identifiers, literals, some function names);
    from the leftmost one the start of the construct is found by walking back over the
    tokens that open it (a function's name and '(', JOIN keywords, '(' SELECT of a subquery).
    ``rendered``: ``node.sql(dialect=DIALECT)`` when the caller has it already (rendering copies
    the node's tree, the main cost of a message); never given for a node that :func:`is_big`. A node
    that stands where the query wrote another is placed where that one is written (:func:`as_written`).
    """
    shown = as_written(node)
    if shown is not node:
        node, rendered = shown, None
    best = _offset(node, sql, rendered)
    if best is None:
        if is_big(node):
            return 0, 0
        frag = rendered if rendered is not None else node.sql(dialect=DIALECT, unsupported_level=ErrorLevel.IGNORE)
        idx = sql.lower().find(frag.lower()) if frag else -1
        if idx < 0:
            head = frag.split("(")[0].strip()
            idx = sql.lower().find(head.lower()) if head else -1
        if idx < 0:
            return 0, 0
        best = idx
    return line_col(sql, best)


#: sqlglot's report of a call with too few arguments, naming its own class (``REGR_COUNT()``)
_MISSING_ARGUMENT = re.compile(r"Required keyword: '\w+' missing for <class 'sqlglot\.expressions\.(?:\w+\.)*(\w+)'>")


def _missing_argument(m: re.Match[str]) -> str:
    cls = getattr(exp, m.group(1), None)
    func: type[exp.Func] | None = cls if isinstance(cls, type) and issubclass(cls, exp.Func) else None
    names = func.sql_names() if func is not None else []
    return f"{names[0] if names else m.group(1).upper()} is missing an argument"


def unclosed(sql: str) -> tuple[str, str, int, int] | None:
    """The quoted text ('...'), quoted name ("...") or block comment (/* ... */) of ``sql`` that is never closed, as
    (what, its opening, line, column), or None when each is closed ('' and "" inside one are an escaped quote)."""
    kinds = {"'": ("quoted text", "'"), '"': ("quoted name", '"'), "/*": ("comment", "*/")}
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        opener = "/*" if sql.startswith("/*", i) else c if c in "'\"" else None
        if opener is None:
            i += 1
            continue
        what, closer = kinds[opener]
        j = i + len(opener)
        while True:
            j = sql.find(closer, j)
            if j < 0:
                line = sql.count("\n", 0, i) + 1
                return what, opener, line, i - (sql.rfind("\n", 0, i) + 1) + 1
            if closer != "*/" and sql.startswith(closer * 2, j):  # '' or "": the quote itself
                j += 2
                continue
            break
        i = j + len(closer)
    return None


def _clean_description(desc: str) -> str:
    def repl(m: re.Match[str]) -> str:
        kind, text = m.group(1), m.group(2)
        return "the end of the query" if kind == "SENTINEL" else repr(text)

    return _MISSING_ARGUMENT.sub(_missing_argument, _TOKEN_REPR.sub(repl, desc))


_BRACKETED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_ $#@]*")
_NOT_BEFORE_BRACKET_NAME = {"VAR", "IDENTIFIER", "R_PAREN", "R_BRACKET", "STRING", "NUMBER"}


def bracket_identifiers(sql: str) -> str:
    """T-SQL's square-bracket identifiers (``[PUMS].[PUMS]``, ``COUNT([age])``, ``[my col]``) as
    double-quoted ones, character for character (so every reported position stays right).

    Only a bracket holding one name (letters, digits, ``_``, spaces) and not written right after
    a value (``x[1]``, ``l[i]`` stay subscripts) is rewritten; a one-element list literal
    ``[col]`` has no use in the DP subset. String literals and comments are left alone (tokens)."""
    if "[" not in sql:
        return sql
    toks = tokens(sql)
    out = list(sql)
    for i, t in enumerate(toks):
        if t.token_type.name != "L_BRACKET" or (i > 0 and toks[i - 1].token_type.name in _NOT_BEFORE_BRACKET_NAME):
            continue
        j = next((k for k in range(i + 1, len(toks)) if toks[k].token_type.name in ("R_BRACKET", "L_BRACKET")), None)
        if j is None or j == i + 1 or toks[j].token_type.name != "R_BRACKET":
            continue
        if _BRACKETED_NAME.fullmatch(sql[t.start + 1 : toks[j].start]):
            out[t.start] = out[toks[j].start] = '"'
    return "".join(out)


def _refuse_top(sql: str) -> None:
    """``SELECT [DISTINCT] TOP n`` (T-SQL) does not parse as DuckDB SQL: say so, with the fix."""
    toks = tokens(sql)
    for i, t in enumerate(toks):
        if t.token_type != TokenType.SELECT:
            continue
        j = i + 1
        while j < len(toks) and toks[j].text.upper() in ("DISTINCT", "ALL"):
            j += 1
        if j + 1 < len(toks) and toks[j].text.upper() == "TOP":
            paren = toks[j + 1].token_type == TokenType.L_PAREN and j + 2 < len(toks)
            k = j + 2 if paren else j + 1
            neg = toks[k].token_type == TokenType.DASH and k + 1 < len(toks)
            nxt_tok = toks[k + 1] if neg else toks[k]
            if nxt_tok.token_type != TokenType.NUMBER:
                continue
            after = toks[k + 2] if neg and k + 2 < len(toks) else toks[k + 1] if not neg and k + 1 < len(toks) else None
            closes = not paren or (after is not None and after.token_type == TokenType.R_PAREN)
            nxt = ("-" if neg else "") + nxt_tok.text
            tail = (toks[toks.index(after) + 1] if paren and closes and toks.index(after) + 1 < len(toks) else after) \
                if after is not None else None
            line, col = line_col(sql, toks[j].start)
            if neg or not closes or not nxt_tok.text.isdigit():
                fix = "LIMIT n with n a non-negative integer literal"
            elif tail is not None and tail.text.upper() == "PERCENT":
                fix = "LIMIT n with a number of rows (a percentage of the released rows has no LIMIT form)"
            elif tail is not None and tail.text.upper() == "WITH":
                fix = f"LIMIT {nxt} (ties are not kept)"
            else:
                fix = f"LIMIT {nxt}"
            shown = f"TOP ({nxt} ...)" if not closes else f"TOP {nxt}"
            if closes and tail is not None and tail.text.upper() == "PERCENT":
                shown += " PERCENT"
            raise UnsupportedQueryError(
                f"SELECT {shown} (T-SQL) is not supported: use {fix} at the end of the query",
                violations=[Violation(f"SELECT {shown} is not supported; use {fix}", line, col, shown)],
                hint=f"write SELECT ... ORDER BY ... {fix}",
            )


#: the fix for BigQuery's differential privacy syntax, which asks per query what dpsql's catalog declares
_PEER_CLAUSE_FIX = ("write the plain SELECT: the privacy unit, contribution caps and value bounds are declared by the "
                    "data owner when the table is registered, and epsilon and delta are passed with the query "
                    "(Session.query(sql, epsilon=..., delta=...), or dpsql query SQL --epsilon ... --delta ...)")
_PEER_BOUNDS_FIX = ("the bounds of a value are its column's, declared when the table is registered; to bound it in the "
                    "query, clamp it with literal bounds: AVG(LEAST(GREATEST(x, lo), hi)) (SUM likewise)")


def _refuse_peer_syntax(sql: str) -> None:
    """BigQuery's ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS(...)`` (and the older ``WITH ANONYMIZATION``), an
    aggregate's ``contribution_bounds_per_group => (lo, hi)`` and ``ANON_AVG(x CLAMPED BETWEEN lo AND hi)`` do not
    parse as DuckDB SQL: name the construct and its fix instead of a syntax error (called on a query that does not
    parse only, so that a column named ``clamped`` or a CTE named ``differential_privacy`` is read as usual)."""
    toks = tokens(sql)
    for i, t in enumerate(toks):
        word = t.text.upper()
        if (t.token_type == TokenType.SELECT and i + 2 < len(toks) and toks[i + 1].token_type == TokenType.WITH
                and toks[i + 2].text.upper() in ("DIFFERENTIAL_PRIVACY", "ANONYMIZATION")):
            what, at = f"SELECT WITH {toks[i + 2].text.upper()}", toks[i + 1]
            fix = _PEER_CLAUSE_FIX
        elif word == "CONTRIBUTION_BOUNDS_PER_GROUP" and i + 1 < len(toks) and toks[i + 1].text == "=>":
            what, at, fix = "an aggregate's contribution_bounds_per_group argument", t, _PEER_BOUNDS_FIX
        elif word == "CLAMPED" and i + 1 < len(toks) and toks[i + 1].token_type == TokenType.BETWEEN:
            what, at, fix = "CLAMPED BETWEEN in an aggregate", t, _PEER_BOUNDS_FIX
        else:
            continue
        line, col = line_col(sql, at.start)
        raise UnsupportedQueryError(f"{what} (BigQuery's differential privacy syntax) is not supported",
                                    violations=[Violation(f"{what} is not supported", line, col, at.text)], hint=fix)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class _NoCommandFallbackWarning(logging.Filter):
    """sqlglot logs a warning, printed on stderr when the application configures no logging, for a
    statement it reads as a generic command (``EXPLAIN SELECT ...``); dpsql refuses such a statement
    with its own message, so the warning is only noise above it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Falling back to parsing as a 'Command'" not in record.getMessage()


logging.getLogger("sqlglot").addFilter(_NoCommandFallbackWarning())


_DUCKDB = sqlglot.Dialect.get_or_raise(DIALECT)


class _Parser(_DUCKDB.parser_class):  # type: ignore[misc,name-defined]
    """DuckDB's parser, but a quoted ``"all"`` in ORDER BY is a column named all (as DuckDB reads it), not ALL."""

    def _parse_ordered(self, parse_method=None):  # type: ignore[no-untyped-def]
        first = self._curr
        ordered = super()._parse_ordered(parse_method)
        if (ordered is not None and first is not None and first.token_type == TokenType.IDENTIFIER
                and isinstance(ordered.this, exp.Var) and ordered.this.name.upper() == "ALL"):
            name = exp.Identifier(this=first.text, quoted=True).update_positions(first)
            ordered.set("this", exp.Column(this=name).update_positions(first))
        return ordered


def _literal_list(node: exp.Expression, quantifier: str) -> list[exp.Expression] | None:
    """The items of ``ANY([...])`` / ``ALL([...])`` (``quantifier``) when ``node`` is one over a list of literals
    (NULL included), else None."""
    if quantifier == "ANY" and isinstance(node, exp.Any):
        arr = node.this
    elif isinstance(node, exp.Anonymous) and str(node.this).upper() == quantifier and len(node.expressions) == 1:
        arr = node.expressions[0]
    else:
        return None
    while isinstance(arr, exp.Paren):
        arr = arr.this
    if not isinstance(arr, exp.Array) or not arr.expressions:
        return None
    plain = (exp.Literal, exp.Boolean, exp.Null)
    if not all(isinstance(i.this if isinstance(i, exp.Neg) else i, plain) for i in arr.expressions):
        return None
    return [i.copy() for i in arr.expressions]


def parse_duckdb(text: str) -> list[exp.Expression | None]:
    """``sqlglot.parse(text, read="duckdb")``, with a quoted ``"all"`` in ORDER BY read as a column (see _Parser).
    A comment holding ``sqlglot.meta`` is dropped before the parse: sqlglot sets each key such a comment names on
    the node it follows, its own too (``start``/``end``, a node's place in the text, set to text made a refusal
    naming the node fail with a bare TypeError; ``nonnull``, ``case_sensitive`` and others change what sqlglot
    makes of the node), and a query's comments mean nothing to it."""
    tokens = _DUCKDB.tokenize(text)
    for token in tokens:
        if token.comments and any(SQLGLOT_META in c for c in token.comments):
            token.comments = [c for c in token.comments if SQLGLOT_META not in c]
    return _Parser(dialect=_DUCKDB).parse(tokens, text)


def order_by_all_alone(stmt: exp.Expression) -> None:
    """DuckDB refuses ORDER BY ALL beside other ORDER BY items (a syntax error): refused here alike."""
    for order in stmt.find_all(exp.Order):
        if len(order.expressions) > 1 and any(isinstance(o.this, exp.Var) and o.this.name.upper() == "ALL"
                                              for o in order.expressions):
            raise SQLSyntaxError(f"ORDER BY ALL must stand alone, but it is written beside other items: "
                                 f"{order.sql(dialect=DIALECT).strip()}",
                                 hint="write ORDER BY ALL (or ORDER BY ALL DESC) alone, or list the outputs by "
                                 "position or name (ORDER BY 1, 2)")


def refuse_empty_groupings(stmt: exp.Expression) -> None:
    """Refuse ``ROLLUP ()`` or ``CUBE ()`` anywhere in GROUP BY, which DuckDB's parser refuses too (it groups by
    nothing: answered, it was the one total, or a refusal of its outputs that named no cause)."""
    for node in stmt.find_all(exp.Rollup, exp.Cube):
        if not node.expressions and node.arg_key == "expressions":  # (GROUP BY a WITH ROLLUP: an empty one of its own)
            kind = "ROLLUP" if isinstance(node, exp.Rollup) else "CUBE"
            raise SQLSyntaxError(
                f"GROUP BY {kind} () names no column: an empty {kind} groups by nothing (DuckDB refuses it too)",
                hint=f"name the columns inside it, e.g. GROUP BY {kind} (a, b); for the one total over all rows, "
                     "leave GROUP BY out")


def parse_statements(sql: str) -> list[exp.Expression]:
    if not isinstance(sql, str):
        raise SQLSyntaxError(f"the query must be a SQL string, got {type(sql).__name__}")
    if not sql.strip():
        raise SQLSyntaxError("the query is empty", hint="pass one SELECT statement")
    m = _UNSTORABLE.search(sql)
    if m is not None:  # neither the engine nor the ledger can hold it: refused here, before any binding
        bad = m.start()
        line, col = line_col(sql, bad)
        what = "a NUL character" if sql[bad] == "\x00" else f"a lone surrogate (U+{ord(sql[bad]):04X}: not valid Unicode)"
        raise SQLSyntaxError(f"the query text holds {what} at line {line}, col {col}", line=line, col=col,
                             hint="pass the query as UTF-8 text without NUL characters (e.g. read the file with "
                             "encoding='utf-8')")
    _refuse_top(sql)
    try:
        stmts = parse_duckdb(bracket_identifiers(sql))
    except sqlglot.errors.ParseError as e:
        _refuse_peer_syntax(sql)  # (only a query that does not parse: a column may be named clamped)
        err = e.errors[0] if e.errors else {}
        line = int(err.get("line") or 0)
        col = int(err.get("col") or 0)
        frag = str(err.get("highlight") or "")
        if frag and col >= len(frag):
            col = col - len(frag) + 1  # sqlglot reports the column where the token ends
        desc = _clean_description(str(err.get("description") or "syntax error"))
        if desc == "GROUPINGSETS is missing an argument":  # GROUP BY GROUPING SETS (), refused by DuckDB's parser too
            raise SQLSyntaxError(
                f"GROUP BY GROUPING SETS () lists no grouping (line {line}, col {col})", line=line, col=col,
                fragment=frag,
                hint="list the groupings inside it, e.g. GROUP BY GROUPING SETS ((a, b), (a), ()), where () is the "
                     "total over all rows; for that total alone, leave GROUP BY out") from None
        raise SQLSyntaxError(
            f"SQL syntax error at line {line}, col {col} near {frag!r}: {desc}",
            line=line,
            col=col,
            fragment=frag,
            hint="check the SQL near the highlighted fragment",
        ) from None
    except sqlglot.errors.TokenError as e:
        foreign = _raised_outside_sqlglot(e)
        if foreign is not None:
            raise foreign from None
        found = unclosed(sql)
        if found is None:  # (the tokenizer's text quotes the SQL around where it stopped, line breaks and all)
            near = str(e).removeprefix("Error tokenizing ")
            near = near if len(near) <= 80 else near[:77] + "..."
            near = near.encode("unicode_escape").decode("ascii")  # on one line
            raise SQLSyntaxError(f"SQL syntax error: the SQL cannot be split into tokens near {near}",
                                 hint="check quotes and brackets") from None
        what, opener, line, col = found
        hint = ("close it with */" if what == "comment" else
                f"close it (a {opener} inside it is written twice: {opener}it{opener}{opener}s{opener}), or check the quotes "
                "before it")
        raise SQLSyntaxError(f"SQL syntax error: a {what} opened by {opener} at line {line}, col {col} is never closed",
                             line=line, col=col, fragment=opener, hint=hint) from None
    # a comment after the last ';' comes back as a statement of its own (an exp.Semicolon holding
    # the comment): it is no statement, as a file of comments only holds none
    out = [s for s in stmts if s is not None and not isinstance(s, exp.Semicolon)]
    if not out:
        raise SQLSyntaxError("the query holds no SQL statement, only comments or ';'",
                             hint="pass one SELECT statement (check that the file or text holds the query itself)")
    for stmt in out:  # comments mean nothing to the query: `status -- note` is the column status
        order_by_all_alone(stmt)
        refuse_empty_groupings(stmt)
        for node in stmt.walk():
            if node.comments:
                node.comments = None
            meta = node._meta
            if meta and any(isinstance(k, str) and k.startswith(OWN_MARKS) for k in meta):
                for k in [k for k in meta if isinstance(k, str) and k.startswith(OWN_MARKS)]:
                    del meta[k]  # a comment's mark (``/* sqlglot.meta dpsql_written */``): dpsql's own are set by it alone
            if isinstance(node, exp.Literal) and not node.is_string:
                _check_number_text(str(node.this))
        for node in list(stmt.find_all(exp.Anonymous)):  # DuckDB's other names of SUM and AVG
            kind = AGG_SPELLINGS.get(str(node.this).lower())
            if kind is not None and len(node.expressions) == 1:
                node.replace(kind(this=node.expressions[0]))
        for cmp in list(stmt.find_all(exp.EQ, exp.NEQ)):  # x = ANY([...]) is x IN (...), x <> ALL([...]) x NOT IN (...)
            items = _literal_list(cmp.expression, "ANY" if isinstance(cmp, exp.EQ) else "ALL")
            if items is not None:
                member = exp.In(this=cmp.this, expressions=items)
                cmp.replace(member if isinstance(cmp, exp.EQ) else exp.Not(this=exp.Paren(this=member)))
        for add in list(stmt.find_all(exp.DateAdd)):  # date_add(d, INTERVAL ...) is d + INTERVAL ... (as DuckDB's)
            if isinstance(add.expression, exp.Interval) and add.args.get("unit") is None:
                add.replace(exp.Add(this=add.this, expression=add.expression))
    return out


#: the prefix of the meta keys dpsql marks nodes with (the read salt's literal, a node's spelling as written, a
#: building block's dialect, a condition moved from ON, a rendering's cached size, ...). sqlglot sets any key a comment
#: names (``/* sqlglot.meta dpsql_read_salt */``) on the node it follows: a parsed node's marks of this prefix are
#: dropped, so that a query's text sets none of them (a node marked as written by ``True`` crashed the analysis)
OWN_MARKS = "dpsql_"


#: DuckDB's other names of SUM and AVG, read as those aggregates (an output is named as the query writes it:
#: ``mean(x)``)
AGG_SPELLINGS: dict[str, type[exp.AggFunc]] = {"mean": exp.Avg, "favg": exp.Avg, "fsum": exp.Sum, "sumkahan": exp.Sum,
                                               "kahan_sum": exp.Sum}


#: the longest number literal read (a DOUBLE written out in full has at most ~330 digits, a DECIMAL 38)
MAX_NUMBER_TEXT = 1000
#: the most digits of a number literal's exponent (a DOUBLE's reaches +-324)
MAX_EXPONENT_DIGITS = 4


def _check_number_text(text: str) -> None:
    """Refuse a number literal beyond any value a column or result holds: Python reads no integer of more than
    4300 digits (a raw ValueError) and no Decimal of an exponent of more than 18 digits (a raw InvalidOperation),
    where the query's analysis meets it (a comparison, IN, LIMIT, ORDER BY, a type's parameters, ...)."""
    _, _, exponent = text.lower().partition("e")
    if len(text) > MAX_NUMBER_TEXT or len(exponent.lstrip("+-")) > MAX_EXPONENT_DIGITS:
        shown = text if len(text) <= 40 else f"{text[:20]}...{text[-10:]} ({len(text)} characters)"
        raise SQLSyntaxError(
            f"the number literal {shown} is out of range: a number may be written with at most {MAX_NUMBER_TEXT} "
            f"characters and an exponent of at most {MAX_EXPONENT_DIGITS} digits",
            hint="write the number in scientific notation within the range of DOUBLE, e.g. 1e308",
        )
