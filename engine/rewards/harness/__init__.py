"""Programs that run inside a sandbox, kept as files so they read, lint and diff like code.

The engine never imports ``codec``, ``program_server``, ``evaluator`` or ``local_guard``: it
reads their text with :func:`source` and hands it to a fresh interpreter (as a file of the
sandbox's ``/box``, or as ``python -c`` text). A sandbox gets only that text, never a mount of
the project, so keeping the programs here weakens nothing. They run on the sandbox's base
interpreter with ``-I`` (no ``site``, no script folder on ``sys.path``), so they import only
the standard library and load ``codec.py`` by hand from the folder they were started from
(``/box`` in a sandbox, a temporary folder under the local guard).
"""

from __future__ import annotations

import json
from importlib import resources


def source(name: str) -> str:
    """Return the text of the harness program ``name`` (e.g. ``"evaluator.py"``)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def program_files(code: bytes) -> dict[str, bytes]:
    """Return the files of an assertion suite's program side, by name: its server and the code."""
    return {
        "server.py": source("program_server.py").encode(),
        "codec.py": source("codec.py").encode(),
        "main.py": code,
    }


def evaluator_files(
    statements: list[tuple[str, bool]], nonce: str, max_reply_bytes: int
) -> dict[str, bytes]:
    """Return the files of an assertion suite's evaluator side, by name: it and its tests."""
    tests = {"nonce": nonce, "statements": statements, "max_reply_bytes": max_reply_bytes}
    return {
        "evaluator.py": source("evaluator.py").encode(),
        "codec.py": source("codec.py").encode(),
        "tests.json": json.dumps(tests).encode(),
    }
