"""Sections a benchmark writes into a page another one writes whole.

A page written from a template (``docs/performance.md``, ``docs/simulation.md``) holds markers,
``<!-- NAME -->`` and ``<!-- /NAME -->``, between which another benchmark writes its figures
(``write_section``); a rewrite of the page from its template carries what is between them over
(``kept_sections``), so each benchmark's figures stay until it runs again.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def write_section(text: str, name: str, heading: str, page: Path) -> None:
    """``text`` as the section ``name`` of ``page``, between its markers; appended under
    ``heading`` if the page has none."""
    old = page.read_text()
    start, end = markers(name)
    body = f"{start}\n{text}{end}"
    if start in old and end in old:
        old = old[: old.index(start)] + body + old[old.index(end) + len(end) :]
    else:
        old = old.rstrip("\n") + f"\n\n## {heading}\n\n{body}\n"
    page.write_text(old)


def kept_sections(page: Path, text: str, names: Iterable[str]) -> str:
    """``text`` (the page anew) with the sections ``names`` that ``page`` now holds carried over."""
    old = page.read_text() if page.is_file() else ""
    for name in names:
        start, end = markers(name)
        if start in old and end in old and start in text and end in text:
            measured = old[old.index(start) : old.index(end)]
            text = text[: text.index(start)] + measured + text[text.index(end) :]
    return text
