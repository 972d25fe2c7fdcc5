"""``tiny://`` URIs: the embedded assets and the tool tasks, resolved to local paths.

``engine.tiny`` resolves the embedded model, data and reward model (``tiny://model``,
``tiny://train.parquet``, ``tiny://reward_model``, ...). The calculator task
(``engine.tools.tiny_task``) adds ``tiny://calculator/<name>``: its seeded model, its data and its
tools YAML, built on first use by ``ensure_calculator_task`` (a few CPU minutes), then cached; the
interpreter task (``engine.tools.tiny_interpreter_task``) adds ``tiny://interpreter/<name>`` the
same way. They are resolved here, not in ``engine.tiny`` or ``tiny_task``: the sources of those
are hashed into their caches' keys, so an edit there rebuilds the tiny model or the task for
everyone.

Every config key that names a path reads it through :func:`resolve_tiny_uri`
(``engine.roles.model_loading.resolve_path``, and ``engine.tools.loader.load_tools`` for
``multi_turn.tool_config_path``).
"""

from __future__ import annotations

from pathlib import Path

from engine.tools.names import (
    CALCULATOR_PREFIX,
    CALCULATOR_URIS,
    INTERPRETER_PREFIX,
    INTERPRETER_URIS,
    TINY_PREFIX,
    TINY_URIS,
    TOOL_TASK_FILES,
)


def tiny_uris() -> list[str]:
    """Return every ``tiny://`` URI: the embedded assets', then the tool tasks'."""
    return list(TINY_URIS)


def resolve_tiny_uri(path: str, data_dir: Path | None = None) -> str:
    """Return the local path of a ``tiny://`` URI, building its asset if needed (in ``data_dir``,
    default ``POSTTRAIN_DATA_DIR``); any other path as given."""
    if not path.startswith(TINY_PREFIX):
        return path
    if path in CALCULATOR_URIS:
        from engine.tools.tiny_task import ensure_calculator_task

        folder = ensure_calculator_task(data_dir)
        return str(folder / TOOL_TASK_FILES[path.removeprefix(CALCULATOR_PREFIX)])
    if path in INTERPRETER_URIS:
        from engine.tools.tiny_interpreter_task import ensure_interpreter_task

        folder = ensure_interpreter_task(data_dir)
        return str(folder / TOOL_TASK_FILES[path.removeprefix(INTERPRETER_PREFIX)])
    known = tiny_uris()
    if path not in known:
        raise ValueError(f"unknown embedded asset {path!r}; valid names are: {', '.join(known)}")
    from engine.tiny import resolve_tiny_path

    return resolve_tiny_path(path, data_dir)
