"""Programs that run inside a sandbox, kept as files so they read, lint and diff like code.

The engine never imports ``codec``, ``program_server``, ``evaluator`` or ``local_guard``: it
reads their text with :func:`source` and hands it to a fresh interpreter (as a file of the
sandbox's ``/box``, or as ``python -c`` text). A sandbox gets only that text, never a mount of
the project, so keeping the programs here weakens nothing. They run on the sandbox's base
interpreter with ``-I`` (no ``site``, no script folder on ``sys.path``), so they import only
the standard library and load ``codec.py`` from ``/box`` by hand.
"""

from __future__ import annotations

from importlib import resources


def source(name: str) -> str:
    """Return the text of the harness program ``name`` (e.g. ``"evaluator.py"``)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
