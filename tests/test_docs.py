"""Citations of the mechanism reference resolve, and nothing cites a document outside the repository.

Docstrings, the README and the docs cite ``docs/mechanisms.md`` by section ("``docs/mechanisms.md``
§2.4", "section 1.2", "§3.1–3.5"). Checked here:

* every section named right after a mention of ``mechanisms.md`` is a heading of docs/mechanisms.md;
* in a file that mentions ``mechanisms.md`` (and in docs/mechanisms.md itself), every "§N.N" names
  such a heading: these files use § only for that document (papers are cited as "Section N");
* Markdown links to mechanisms.md point at the real file;
* no file cites the team-external copy (``../shared``, ``spec/mechanisms.md``).

Each checker is also run on a made-up citation it must reject (negative controls).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "mechanisms.md"

HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
#: "§2.4", "§ 2.4", "section 1.2", "sections 3.7–3.9", "§1.5–§1.9"
REF = re.compile(r"(?:§\s*|\bsections?\s+)(\d+(?:\.\d+)*)(?:\s*[–-]\s*§?\s*(\d+(?:\.\d+)*))?", re.IGNORECASE)
SECTION_SIGN = re.compile(r"§\s*(\d+(?:\.\d+)*)(?:\s*[–-]\s*§?\s*(\d+(?:\.\d+)*))?")
MENTION = "mechanisms.md"
#: how far after a mention of mechanisms.md a section number still belongs to it
WINDOW = 80
MD_LINK = re.compile(r"\]\(([^)\s#]*mechanisms\.md)(?:#[^)]*)?\)")
#: paths of the team-external spec that must never be cited
EXTERNAL = ("../shared", "spec/mechanisms.md", "shared/spec")


def doc_sections(text: str) -> set[str]:
    return set(HEADING.findall(text))


def _expand(first: str, last: str | None) -> list[str]:
    """"3.1"–"3.5" -> 3.1 … 3.5 (same parent); otherwise just the two ends."""
    if not last:
        return [first]
    a, b = first.split("."), last.split(".")
    if len(a) == len(b) and a[:-1] == b[:-1] and int(a[-1]) <= int(b[-1]):
        return [".".join([*a[:-1], str(i)]) for i in range(int(a[-1]), int(b[-1]) + 1)]
    return [first, last]


def cited_sections(text: str, *, self_doc: bool = False) -> list[tuple[int, str]]:
    """(line, section) for every citation of mechanisms.md in ``text`` (rules in the module docstring)."""
    out: list[tuple[int, str]] = []
    starts = [m.start() for m in re.finditer(re.escape(MENTION), text)]
    for i, pos in enumerate(starts):
        end = min(pos + len(MENTION) + WINDOW, starts[i + 1] if i + 1 < len(starts) else len(text))
        window = text[pos + len(MENTION) : end]
        for m in REF.finditer(window):
            line = text.count("\n", 0, pos + len(MENTION) + m.start()) + 1
            out += [(line, s) for s in _expand(m.group(1), m.group(2))]
    if starts or self_doc:
        for m in SECTION_SIGN.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out += [(line, s) for s in _expand(m.group(1), m.group(2))]
    return out


def missing_sections(text: str, sections: set[str], *, self_doc: bool = False) -> list[str]:
    return sorted({f"line {ln}: §{s}" for ln, s in cited_sections(text, self_doc=self_doc) if s not in sections})


def product_files() -> list[Path]:
    files = sorted((ROOT / "dpsql").rglob("*.py"))
    files += [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tests/vectors/README.md"]
    files += sorted((ROOT / "benchmarks").glob("*.py"))
    return [f for f in files if f.is_file()]


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


@pytest.fixture(scope="module")
def sections() -> set[str]:
    found = doc_sections(DOC.read_text(encoding="utf-8"))
    # the section numbers the code has always cited (the spec's §1–§6) must all be there
    for s in ["1", "1.1", "1.2", "1.3", "1.5", "1.6", "1.8", "1.9", "2", "2.2", "2.3", "2.4", "2.5", "2.6",
              "2.7", "3", "3.1", "3.2", "3.3", "3.4", "3.5", "3.8", "4", "5", "6"]:
        assert s in found, f"docs/mechanisms.md has no section {s}"
    return found


def test_every_cited_section_exists(sections: set[str]) -> None:
    problems: list[str] = []
    checked = 0
    for path in product_files():
        text = path.read_text(encoding="utf-8")
        self_doc = path == DOC
        checked += len(cited_sections(text, self_doc=self_doc))
        problems += [f"{_rel(path)} {p}" for p in missing_sections(text, sections, self_doc=self_doc)]
    assert not problems, "citations of sections that docs/mechanisms.md does not have:\n" + "\n".join(problems)
    # the check is not vacuous: the docstrings, README and docs cite dozens of sections
    assert checked >= 50, checked


def test_citation_checker_rejects_unknown_sections(sections: set[str]) -> None:
    """Negative controls: made-up citations in each form are caught, real ones pass."""
    assert missing_sections("see ``docs/mechanisms.md`` §2.4 and §1.5", sections) == []
    assert missing_sections("``docs/mechanisms.md`` section 1.", sections) == []
    assert missing_sections("see ``docs/mechanisms.md`` §19.4", sections) == ["line 1: §19.4"]
    assert missing_sections("see docs/mechanisms.md section 2.44", sections) == ["line 1: §2.44"]
    assert missing_sections("(docs/mechanisms.md §3.1–3.13)", sections) == ["line 1: §3.12", "line 1: §3.13"]
    # a bare § elsewhere in a file that cites the reference counts too
    assert missing_sections("uses docs/mechanisms.md.\n\nlater: §8.1", sections) == ["line 3: §8.1"]
    # ... but not in a file that never mentions it (noise.py cites Mironov 2012, §5.2)
    assert missing_sections("Mironov 2012, §8.2", sections) == []


def test_markdown_links_to_the_reference_resolve() -> None:
    links = 0
    for path in product_files():
        if path.suffix != ".md":
            continue
        for m in MD_LINK.finditer(path.read_text(encoding="utf-8")):
            links += 1
            target = (path.parent / m.group(1)).resolve()
            assert target == DOC, f"{_rel(path)}: link {m.group(1)!r} does not point at docs/mechanisms.md"
    assert links >= 2  # README and tests/vectors/README.md link it
    # negative control: the old relative link from tests/vectors/README.md resolves elsewhere
    assert (ROOT / "tests/vectors/../mechanisms.md").resolve() != DOC


def test_no_citation_of_the_external_spec() -> None:
    offenders = []
    scope = [p for p in product_files() if not _rel(p).startswith("benchmarks/")]
    for path in scope:
        text = path.read_text(encoding="utf-8")
        offenders += [f"{_rel(path)}: {e}" for e in EXTERNAL if e in text]
    # the spec's own path may appear nowhere in the repository's code, docs or tests but here
    # (benchmarks/dawa.py reads its data set from a folder beside the repository at run time,
    # which is not a citation)
    for path in [*sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]:
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        offenders += [f"{_rel(path)}: {e}" for e in ("spec/mechanisms.md", "shared/spec") if e in text]
    assert not offenders, "citations of the external spec:\n" + "\n".join(offenders)
