"""The recorder interface: how a training run reports to the outside world.

The trainer calls a recorder at fixed points of the loop; a recorder never changes training.
Built-in recorders print a progress line (``ConsoleRecorder``) or append JSON lines
(``JsonlRecorder``); the web studio's driver supplies one that writes to PostgreSQL and publishes
to the run's channel group. ``should_stop`` is polled once per step so a cancel request stops the
run within one step, after which the trainer saves a checkpoint.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TextIO


class RunOutcome(StrEnum):
    """How a training run ended, as ``fit`` returns it and ``Recorder.on_finish`` receives it.

    The studio's ``webapp.runs.models.RunStatus`` takes its three end states from here (it adds
    the states of a run that has not ended), so there is one vocabulary of run states, and
    comparing with a plain string still works.
    """

    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass
class SampleRecord:
    """One rollout sample as the studio stores it: keyed by (step, split, prompt_index, sample_index).

    Per-token lists have one entry per response token (``response_length`` entries, EOS
    included); ``token_ref_logprobs`` is None when no reference policy ran.
    """

    step: int
    split: str  # "train" or "val"
    prompt_index: int
    sample_index: int
    group_id: str
    data_source: str
    prompt_text: str
    response_text: str
    ground_truth: str | None
    reward: float
    reward_parts: dict[str, Any] = field(default_factory=dict)
    reward_error: str | None = None
    advantage: float | None = None
    response_length: int = 0
    truncated: bool = False
    # Multi-turn rollouts: each turn after the prompt (assistant text and its tool calls, tool
    # answers with their errors, interaction messages); None for single-turn samples.
    turns: list[dict[str, Any]] | None = None
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    token_ref_logprobs: list[float] | None = None
    token_advantages: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the record as a JSON-serialisable dict."""
        return asdict(self)


class Recorder:
    """Base recorder: every hook is a no-op, so subclasses override only what they need."""

    def on_start(self, *, config: dict[str, Any], total_steps: int, start_step: int) -> None:
        """Called once before the first step (``start_step`` > 0 when resuming)."""

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        """Called after each training step with verl-named metrics (``critic/score/mean``...)."""

    def on_samples(self, step: int, samples: list[SampleRecord]) -> None:
        """Called with the rollout samples of a step (train) or of a validation pass (val)."""

    def on_checkpoint(self, step: int, path: str) -> None:
        """Called after a checkpoint for ``step`` was written to ``path``."""

    def on_finish(self, *, status: str, error: str | None = None) -> None:
        """Called once at the end: status is succeeded, failed or cancelled."""

    def should_stop(self) -> bool:
        """Return True to stop the run after the current step (a cancel request)."""
        return False


class CompositeRecorder(Recorder):
    """Fan each hook out to several recorders; stop when any of them asks to."""

    def __init__(self, recorders: list[Recorder]) -> None:
        self.recorders = list(recorders)

    def on_start(self, *, config: dict[str, Any], total_steps: int, start_step: int) -> None:
        for r in self.recorders:
            r.on_start(config=config, total_steps=total_steps, start_step=start_step)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        for r in self.recorders:
            r.on_step(step, metrics)

    def on_samples(self, step: int, samples: list[SampleRecord]) -> None:
        for r in self.recorders:
            r.on_samples(step, samples)

    def on_checkpoint(self, step: int, path: str) -> None:
        for r in self.recorders:
            r.on_checkpoint(step, path)

    def on_finish(self, *, status: str, error: str | None = None) -> None:
        for r in self.recorders:
            r.on_finish(status=status, error=error)

    def should_stop(self) -> bool:
        return any(r.should_stop() for r in self.recorders)


class ConsoleRecorder(Recorder):
    """Print one progress line per step with the key metrics, and the final status."""

    KEYS = (
        ("critic/score/mean", "score"),
        ("actor/pg_loss", "pg_loss"),
        ("actor/kl_loss", "kl"),
        ("actor/entropy", "entropy"),
        ("response_length/mean", "len"),
        ("timing_s/step", "s/step"),
    )

    def __init__(self, stream: TextIO | None = None, *, every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"trainer.log_freq={every} must be at least 1 (every step)")
        self.stream = stream or sys.stdout
        self.every = every  # print every Nth step (trainer.log_freq), and always the last
        self.total_steps = 0
        self.started = time.monotonic()

    def on_start(self, *, config: dict[str, Any], total_steps: int, start_step: int) -> None:
        self.total_steps = total_steps
        self.started = time.monotonic()

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.every and step != self.total_steps:
            return
        width = 20
        done = int(width * step / max(self.total_steps, 1))
        bar = "#" * done + "." * (width - done)
        parts = [f"{label}={metrics[key]:.4g}" for key, label in self.KEYS if key in metrics]
        val = [f"{k}={v:.3f}" for k, v in metrics.items() if k.startswith("val-core/")]
        elapsed = time.monotonic() - self.started
        line = f"[{bar}] step {step}/{self.total_steps} {elapsed:.0f}s " + " ".join(parts + val)
        print(line, file=self.stream, flush=True)

    def on_samples(self, step: int, samples: list[SampleRecord]) -> None:
        """Print validation samples as a small table: score, input, output (train: nothing).

        The trainer hands this logger only the ``trainer.log_val_generations`` it picked.
        """
        rows = [s for s in samples if s.split == "val"]
        if not rows:
            return
        lines = [
            f"validation generations at step {step} ({len(rows)}):",
            "  score | input | output",
        ]
        for s in rows:
            lines.append(f"  {s.reward:5.2f} | {_cell(s.prompt_text)} | {_cell(s.response_text)}")
        print("\n".join(lines), file=self.stream, flush=True)

    def on_checkpoint(self, step: int, path: str) -> None:
        print(f"checkpoint step {step}: {path}", file=self.stream, flush=True)

    def on_finish(self, *, status: str, error: str | None = None) -> None:
        tail = f": {error.strip().splitlines()[-1]}" if error else ""
        print(f"run {status}{tail}", file=self.stream, flush=True)


class JsonlRecorder(Recorder):
    """Append metrics to ``metrics.jsonl`` and samples to ``samples.jsonl`` in a directory."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _append(self, name: str, rows: list[dict[str, Any]]) -> None:
        with open(self.directory / name, "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self._append("metrics.jsonl", [{"step": step, "time": time.time(), **metrics}])

    def on_samples(self, step: int, samples: list[SampleRecord]) -> None:
        self._append("samples.jsonl", [s.to_dict() for s in samples])


def _cell(text: str, width: int = 48) -> str:
    """Return ``text`` on one line, cut to ``width`` characters for a console table."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."
