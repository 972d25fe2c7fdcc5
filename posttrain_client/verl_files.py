"""Read what a verl run writes to disk: its file logger's JSONL and its rollout dumps.

The formats, as verl (``volcengine/verl``) writes them:

- ``verl/utils/tracking.py``, ``FileLogger``: with ``trainer.logger=[..., file]`` every
  ``Tracking.log(data, step)`` call appends one line ``{"step": N, "data": {...}}`` (orjson, so a
  NaN or inf is written as ``null``: read back as NaN) to ``$VERL_FILE_LOGGER_PATH``, else to
  ``$VERL_FILE_LOGGER_ROOT/<project_name>/<experiment_name>.jsonl`` (root: the working folder).
  The file is opened with ``"wb"``: a run started again truncates it. ``RayPPOTrainer.fit``
  (``verl/trainer/ppo/ray_trainer.py``) logs once per training step, after the step's rollout
  dump and validation, and once at step 0 for the validation before training.
- ``verl/trainer/ppo/ray_trainer.py``, ``RayPPOTrainer._dump_generations`` (called by
  ``_log_rollout_data`` with ``trainer.rollout_data_dir`` and by ``_validate`` with
  ``trainer.validation_data_dir``): one file ``<global_steps>.jsonl`` per step, written whole
  with ``open(..., "w")``, one line per response: ``input`` and ``output`` (the decoded prompt
  and response), ``gts`` (the ground truth, any JSON), ``score`` (the sequence's reward, the sum
  of its token-level scores), ``step``, and every reward extra (``reward_extra_infos_dict``:
  e.g. ``acc``, ``pred``) whose list has one entry per line. The lines of a prompt's group are
  not adjacent (``_balance_batch`` reorders the batch), and nothing names the prompt but its text.

This module only reads; ``posttrain_client.watch`` decides when a file is complete and sends it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:  # verl's own FileLogger needs orjson: a verl machine has it, and it reads 5x faster
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - exercised where orjson is missing
    _fast_loads = json.loads


def _loads(line: bytes) -> Any:
    """Parse one JSON line; Python's json where orjson refuses (``_dump_generations`` writes a
    NaN score as ``NaN``, which only Python's json reads)."""
    try:
        return _fast_loads(line)
    except ValueError:
        return json.loads(line)


DUMP_NAME = re.compile(r"(\d+)\.jsonl")
# The dump keys that are the sample itself; every other key is a reward extra.
DUMP_FIELDS = ("input", "output", "gts", "score", "step")


@dataclass(frozen=True)
class LoggedStep:
    """One line of the file logger: a step and its numeric metrics (verl's names)."""

    step: int
    metrics: dict[str, float]
    skipped: tuple[str, ...] = ()  # keys whose values were not numbers


def metric_value(value: Any) -> float:
    """Return a logged value as a metric; ValueError if it is not a number.

    A null is NaN: orjson, which ``FileLogger`` writes with, writes NaN and inf as null, so a
    null loss is a loss that went non-finite (the studio's health check says so).
    """
    if value is None:
        return math.nan
    if isinstance(value, bool | int | float):
        return float(value)
    raise ValueError(f"{value!r} is not a number")


def parse_logger_line(line: bytes | str) -> LoggedStep:
    """Return the step of one ``FileLogger`` line; ValueError for a line that is not one."""
    record = json.loads(line)
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
        raise ValueError('not a file-logger line: expected {"step": N, "data": {...}}')
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step={step!r} is not a step number")
    metrics: dict[str, float] = {}
    skipped = []
    for key, value in record["data"].items():
        try:
            metrics[str(key)] = metric_value(value)
        except ValueError:
            skipped.append(str(key))
    return LoggedStep(step, metrics, tuple(skipped))


def read_new_lines(path: Path, offset: int) -> tuple[list[bytes], int]:
    """Return the complete lines of ``path`` from byte ``offset`` on, and the offset after them.

    A line still being written (no newline yet) is left for the next read.
    """
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    return [line for line in data[: end + 1].splitlines() if line.strip()], offset + end + 1


def dump_steps(folder: Path) -> dict[int, Path]:
    """Return the rollout dumps in ``folder`` by step (``<step>.jsonl``)."""
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.iterdir():
        match = DUMP_NAME.fullmatch(path.name)
        if match and path.is_file():
            found[int(match.group(1))] = path
    return found


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else json.dumps(value)


def dump_samples(path: Path, step: int, split: str) -> Iterator[dict[str, Any]]:
    """Yield the samples of one rollout dump as the studio's API takes them.

    A prompt's group is its text: the n-th line with a given ``input`` is sample n of that
    prompt (the studio derives the prompt's index from its text). The reward extras become the
    reward parts; a ``data_source`` extra, when a reward function returns one, is the sample's
    data source.
    """
    seen: dict[str, int] = {}
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = _loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
            prompt = _text(row.get("input"))
            index = seen.get(prompt, 0)
            seen[prompt] = index + 1
            parts = {k: v for k, v in row.items() if k not in DUMP_FIELDS}
            source = parts.pop("data_source", "")
            score = row.get("score")
            if isinstance(score, bool) or not isinstance(score, int | float):
                score = None
            yield {
                "step": step,
                "split": split,
                "prompt": prompt,
                "response": _text(row.get("output")),
                "reward": score if score is None or math.isfinite(score) else None,
                "sample_index": index,
                "ground_truth": row.get("gts"),
                "reward_parts": parts,
                "data_source": source if isinstance(source, str) else str(source),
            }
