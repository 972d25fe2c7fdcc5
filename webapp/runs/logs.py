"""A run's own log: the driver's stdout and stderr, as the run page tails, searches and downloads it.

The driver's output goes to ``driver.log`` in the run's folder, beside its checkpoints: a local
driver's process writes there from its first byte (``workers.tasks.spawn_local_driver``), and a
driver started as a Ray Job points its output there as it starts (``workers.driver.main``). The
operating system writes the file, not the driver's Python, so the last words of a driver that
crashes (a segfault, the OOM killer's note from a child) are in it too. The file stays when the
run ends and goes with the run's folder when the run is deleted.

Reading is by byte offsets, cut at line ends, so a reader that asks again from where it stopped
gets each line once and whole (a newline never falls inside a UTF-8 character). What a page
shows is bounded: the tail it opens with is the last ``TAIL_BYTES``, and a reader that fell more
than ``CHUNK_BYTES`` behind skips ahead to the newest ``TAIL_BYTES`` and is told how much it
skipped; the whole log stays downloadable and searchable. Progress bars that redraw a line with
carriage returns read as the terminal shows them: the text after the last ``\\r``. Terminal
colour codes are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from webapp.runs.models import Run

LOG_FILE = "driver.log"
TAIL_BYTES = 64 * 1024  # what a page opens with
CHUNK_BYTES = 256 * 1024  # the most one read sends; a reader further behind skips ahead
SEARCH_MAX_MATCHES = 500
SEARCH_MAX_CHARS = 200  # the longest search text
LINE_SHOWN_CHARS = 2000  # a search match longer than this is cut

# CSI sequences (colours, cursor moves) and OSC sequences (titles, links) of a terminal.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def run_log_path(run: Run) -> Path | None:
    """Return the run's ``driver.log`` (in its folder, the parent of its checkpoints), or None.

    None for a run without a folder; the file itself may not exist yet.
    """
    if not run.checkpoint_dir:
        return None
    return Path(run.checkpoint_dir).parent / LOG_FILE


def clean_lines(text: str) -> str:
    """Return ``text`` as a terminal shows it: no colour codes, each line's text after its last
    carriage return (a progress bar's final state)."""
    text = _ANSI.sub("", text)
    return "\n".join(line.rstrip("\r").rpartition("\r")[2] for line in text.split("\n"))


@dataclass(frozen=True)
class LogChunk:
    """Text of the log from ``start`` to ``end`` (byte offsets); ``skipped`` bytes before it
    were left out (the reader was too far behind); ``reset`` when the file is new to the reader
    (it was replaced, or shrank)."""

    text: str
    start: int
    end: int
    skipped: int = 0
    reset: bool = False

    def as_message(self) -> dict[str, object]:
        """Return the chunk as the run socket's ``log`` message."""
        return {
            "type": "log",
            "text": self.text,
            "offset": self.end,
            "skipped": self.skipped,
            "reset": self.reset,
        }


def _cut_at_line_end(data: bytes) -> bytes:
    """Return ``data`` up to its last newline (whole, when it is one line past CHUNK_BYTES)."""
    cut = data.rfind(b"\n")
    if cut >= 0:
        return data[: cut + 1]
    return data if len(data) >= CHUNK_BYTES else b""


def log_read(path: Path | None, offset: int | None) -> LogChunk | None:
    """Return the log's text after byte ``offset`` (None: its tail), or None when nothing is new.

    Only whole lines are returned, unless a line is longer than ``CHUNK_BYTES``. A file smaller
    than ``offset`` was replaced: it is read from its tail again, with ``reset``.
    """
    if path is None or not path.is_file():
        return None
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        reset = offset is not None and size < offset
        tail = offset is None or reset or size - offset > CHUNK_BYTES
        start = offset if offset is not None and not tail else max(0, size - TAIL_BYTES)
        if tail and start > 0:  # a tail starts at its first whole line
            f.seek(start - 1)
            data = f.read(size - start + 1)
            newline = data.find(b"\n")
            data = data[newline + 1 :] if newline >= 0 else b""
            start = size - len(data)
        else:
            f.seek(start)
            data = f.read(size - start)
    skipped = start - offset if offset is not None and not reset and start > offset else 0
    data = _cut_at_line_end(data)
    if not data and not reset:
        return None
    text = clean_lines(data.decode("utf-8", "replace"))
    return LogChunk(text, start, start + len(data), skipped, reset)


def log_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line number from 1, line)`` of the whole log, cleaned as the page shows it."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            yield number, clean_lines(raw.decode("utf-8", "replace").rstrip("\n"))


@dataclass(frozen=True)
class LogSearch:
    matches: list[tuple[int, str]]  # (line number, line), at most SEARCH_MAX_MATCHES
    truncated: bool  # more lines matched than were returned


class LogSearchError(ValueError):
    """The search text cannot be used; the message says what to type."""


def log_search(path: Path | None, query: str) -> LogSearch:
    """Return the lines of the whole log that contain ``query``, ignoring case, oldest first."""
    query = query.strip()
    if not query:
        raise LogSearchError("type the text to find, e.g. Traceback or reward")
    if len(query) > SEARCH_MAX_CHARS:
        raise LogSearchError(f"search for at most {SEARCH_MAX_CHARS} characters")
    if path is None or not path.is_file():
        return LogSearch([], False)
    needle = query.casefold()
    matches: list[tuple[int, str]] = []
    for number, line in log_lines(path):
        if needle in line.casefold():
            if len(matches) == SEARCH_MAX_MATCHES:
                return LogSearch(matches, True)
            matches.append((number, line[:LINE_SHOWN_CHARS]))
    return LogSearch(matches, False)
