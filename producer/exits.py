"""The exit codes of every command, in one table (docs/reference/cli.md, "Exit codes").

    0    done: the exam ended with every chapter done (or the command did what it was asked)
    1    some chapters failed (their errors are printed), a `doctor` check failed, or
         `export --approved-only` found nothing approved (no file is written)
    2    input or configuration: one line names the file, field or setting
    3    a service is down (the database, the broker)
    4    the database is damaged
    5    the exam is paused: the provider refused every call, the key was rejected, the
         endpoint was unreachable, or blind solves kept disagreeing (`resume` after the fix)
    6    the exam stopped at its budget (raise it: `enqueue --budget-usd`, which resumes)
    7    the exam, or some of its chapters, were cancelled
    130  interrupted (Ctrl-C, SIGTERM): what was committed is kept; run the same command

`run` exits 0 only when its exam ended done; `status --watch` ends with the same code.
"""

from __future__ import annotations

from typing import Any

DONE = 0
FAILED = 1
INPUT = 2
SERVICE_DOWN = 3
DATABASE_DAMAGED = 4
PAUSED = 5
BUDGET = 6
CANCELLED = 7
INTERRUPTED = 130


def of_report(report: Any) -> int:
    """The exit code an exam's state asks for, from its report (storage.report_types.ExamReport):
    paused first (its work cannot go on until someone acts), then failed chapters, then
    cancelled ones; DONE only when every chapter is done."""
    if report.state == "paused":
        return BUDGET if report.pause_code == "budget" else PAUSED
    if report.chapters.failed:
        return FAILED
    if report.chapters.cancelled:
        return CANCELLED
    if report.chapters.done < report.chapters.total:
        return FAILED
    return DONE
