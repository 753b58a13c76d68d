"""Progress on stderr, and notes: a note is logged at once and kept for the end of the table."""

from __future__ import annotations

import sys


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def note(notes: list, msg: str) -> None:
    """Keep ``msg`` for the table's notes and log it now."""
    notes.append(msg)
    log("note: " + msg)


def fmt_secs(s: float) -> str:
    s = max(0.0, s)
    return f"{int(s // 60)}m{int(s % 60):02d}s"
