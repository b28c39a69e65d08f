"""A PDF's text, extracted in a child process under a work budget.

Bytes and pages are capped before extraction (examforge.sources), but the work of extraction is
not bounded by either: a few kilobytes can hold one compressed content stream of hundreds of
thousands of text operators that every page shares, and pypdf parses it again for each page
(minutes of CPU and hundreds of MB for a 7 KB file). pypdf has limits on decompression, not on
the operators it interprets, so this is written by hand: the parent runs
`python -m examforge.pdf_extract` with the file on stdin, and the child

- limits itself: RLIMIT_CPU (PDF_FILE_CPU_S a file) and RLIMIT_AS (PDF_MEMORY_BYTES), so
  that neither a loop nor an allocation in pypdf can outlast the budget;
- gives each page PDF_PAGE_CPU_S of CPU (an ITIMER_PROF alarm): a real course page takes a few
  hundredths of a second, so a page over it is refused, named;
- stops once the text passes MAX_SOURCE_CHARS;
- writes one JSON object to stdout: {"sections": [[where, text], ...]} or {"error": "..."}.

The parent (`extract`) turns a child killed by a limit into the same one-line refusal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

# The work budget of one PDF (docs/how-to/grounding.md, "Limits").
PDF_PAGE_CPU_S = 1.0  # CPU seconds to extract one page's text
PDF_FILE_CPU_S = 60  # CPU seconds for the whole file, as a backstop to the per-page alarm
PDF_MEMORY_BYTES = 1024 * 1024 * 1024  # the child's address space
MAX_SOURCE_CHARS = 2_000_000  # characters of text from one file (a 500-page book is ~1.5 M)


class _PageTooCostly(Exception):
    """Raised in the child, by its timer, when one page's text costs more than PDF_PAGE_CPU_S
    of CPU; caught next to it (a private control flow, outside the error tree)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _PageTooCostly()


def _extract(data: bytes, max_pages: int, first: int | None, last: int | None
             ) -> dict[str, Any]:
    import io
    import logging

    from pypdf import PdfReader

    logging.getLogger("pypdf").setLevel(logging.CRITICAL)  # the refusal says it in one line
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            return {"error": "encrypted PDF; export it without a password"}
        count = len(reader.pages)
    except Exception as exc:  # pypdf raises many kinds for a damaged file
        return {"error": f"unreadable PDF ({type(exc).__name__}: {exc})"}
    result: dict[str, Any] = {"count": count, "sections": []}
    if count > max_pages:
        return result  # the parent refuses it, before any page is read
    if first is None or last is None:
        first, last = 1, count
    if last > count:
        return result  # the parent says which pages were asked
    signal.signal(signal.SIGPROF, _on_alarm)
    chars = 0
    for number in range(first, last + 1):
        signal.setitimer(signal.ITIMER_PROF, PDF_PAGE_CPU_S)
        try:
            text = reader.pages[number - 1].extract_text() or ""
        except _PageTooCostly:
            return {"error": f"page {number} takes more than {PDF_PAGE_CPU_S:g} s of CPU to "
                             "extract (an unusual content stream); give its text as notes"}
        except Exception as exc:
            return {"error": f"unreadable PDF page {number} ({type(exc).__name__}: {exc})"}
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        chars += len(text)
        if chars > MAX_SOURCE_CHARS:
            return {"error": f"more than {MAX_SOURCE_CHARS:,} characters of text by page "
                             f"{number}; split it, or list pages (name.pdf#pages=1-50)"}
        if text.strip():
            result["sections"].append((f"page {number}", text))
    return result


def main() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (PDF_FILE_CPU_S, PDF_FILE_CPU_S + 1))
    resource.setrlimit(resource.RLIMIT_AS, (PDF_MEMORY_BYTES, PDF_MEMORY_BYTES))
    max_pages = int(sys.argv[1])
    first = int(sys.argv[2]) if len(sys.argv) > 3 else None
    last = int(sys.argv[3]) if len(sys.argv) > 3 else None
    data = sys.stdin.buffer.read()
    try:
        result = _extract(data, max_pages, first, last)
    except MemoryError:
        result = {"error": f"extracting its text needs more than "
                           f"{PDF_MEMORY_BYTES // 2**20} MB"}
    sys.stdout.write(json.dumps(result))


def extract(data: bytes, pages: tuple[int, int] | None, max_pages: int) -> dict[str, Any]:
    """The child's answer for `data` (see the module's docstring); {"error": ...} when a limit
    killed it. A file of more than `max_pages` pages answers its count and no section."""
    args = [sys.executable, "-m", "examforge.pdf_extract", str(max_pages),
            *(map(str, pages or ()))]
    try:
        done = subprocess.run(args, input=data, capture_output=True,
                              timeout=PDF_FILE_CPU_S * 3, env={**os.environ, "PYTHONHASHSEED": "0"})
    except subprocess.TimeoutExpired:
        return {"error": f"extracting its text took longer than {PDF_FILE_CPU_S * 3} s"}
    if done.returncode == -signal.SIGXCPU or done.returncode == -signal.SIGKILL:
        return {"error": f"extracting its text takes more than {PDF_FILE_CPU_S} s of CPU"}
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        reason = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])
        if "MemoryError" in reason[-1]:
            return {"error": f"extracting its text needs more than "
                             f"{PDF_MEMORY_BYTES // 2**20} MB"}
        return {"error": f"its text could not be extracted ({reason[-1][:160]})"}
    return answer if isinstance(answer, dict) else {"error": "its text could not be extracted"}


if __name__ == "__main__":
    main()
