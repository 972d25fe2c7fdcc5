"""``PostTrainCallback``: report a TRL ``GRPOTrainer`` run to PostTrain Studio.

    from posttrain_client.trl import PostTrainCallback

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), ...)
    PostTrainCallback.attach(trainer, name="qwen grpo")  # POSTTRAIN_URL, POSTTRAIN_TOKEN
    trainer.train()

The run appears in the studio as it trains: every ``on_log``'s metrics under TRL's names, with
verl's names beside the ones that mean the same (``reward`` is also ``critic/score/mean``, see
``VERL_NAMES``), so the run page's summary, the health checks and comparisons with verl runs
line up; the latest generation's completions with each reward function's score as the reward
parts and the weighted total as the reward, grouped by prompt; the ``GRPOConfig`` as the run's
config. The completions are read from the trainer's own record of its last generation
(``GRPOTrainer._logs``, the table ``log_completions`` prints; TRL 1.16), which is why the
callback needs the trainer: made without one it reports metrics and config only.

Failure policy: the training loop never waits on the studio: reports go through a background
thread in order; a studio that does not answer for ``retry_for_s`` seconds costs those reports
(one warning), and a refusal (a revoked token) stops reporting. The run ends as succeeded,
cancelled (when the owner cancelled it and ``allow_cancel`` let the callback stop training at
the next step) or failed (the process ended with an uncaught exception, whose traceback becomes
the run's error).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from posttrain_client.client import Studio, StudioError
from posttrain_client.external import BackgroundSender, ExternalRun, StudioUnreachable, new_key

logger = logging.getLogger("posttrain_client")

CLIENT = "posttrain_client.trl"
KEY_FILE = "posttrain-run.json"
# TRL's metric -> verl's name for the same quantity (both are kept).
VERL_NAMES = {
    "reward": "critic/score/mean",
    "completions/mean_length": "response_length/mean",
    "completions/max_length": "response_length/max",
    "completions/min_length": "response_length/min",
    "completions/clipped_ratio": "response_length/clip_ratio",
    "entropy": "actor/entropy",
    "kl": "actor/kl_loss",
    "clip_ratio/region_mean": "actor/pg_clipfrac",
    "grad_norm": "actor/grad_norm",
    "learning_rate": "actor/lr",
}


def message_text(value: Any) -> str:
    """Return a prompt or completion as text: a string as is, chat messages as ``role: text``
    lines (a lone assistant message as its text)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        if len(value) == 1 and value[0].get("role") == "assistant":
            return str(value[0].get("content", ""))
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in value)
    return json.dumps(value, default=str)


def metrics_of(logs: dict[str, Any]) -> dict[str, float]:
    """Return the numbers of a TRL log, with verl's names added (``VERL_NAMES``)."""
    metrics: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        metrics[key] = float(value)  # a NaN goes out as NaN: the studio's health checks see it
        if key in VERL_NAMES:
            metrics[VERL_NAMES[key]] = metrics[key]
    return metrics


def completions_of(trainer: Any, step: int) -> list[dict[str, Any]]:
    """Return the samples of the trainer's last generation (``GRPOTrainer._logs``)."""
    logs = trainer._logs
    prompts, completions = list(logs["prompt"]), list(logs["completion"])
    rewards = {name: list(values) for name, values in logs["rewards"].items()}
    advantages = list(logs["advantages"])
    weights = [float(w) for w in trainer.reward_weights.tolist()]
    names = list(trainer.reward_func_names)
    seen: dict[str, int] = {}
    samples = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        text = message_text(prompt)
        index = seen.get(text, 0)
        seen[text] = index + 1
        parts = {name: rewards[name][i] for name in names if i < len(rewards.get(name, []))}
        scored = [(w, parts.get(n)) for w, n in zip(weights, names, strict=True)]
        finite = [w * v for w, v in scored if v is not None and math.isfinite(v)]
        samples.append(
            {
                "step": step,
                "prompt": text,
                "response": message_text(completion),
                "reward": sum(finite) if finite else None,
                "reward_parts": parts,
                "advantage": advantages[i] if i < len(advantages) else None,
                "sample_index": index,
            }
        )
    return samples


class PostTrainCallback(TrainerCallback):
    """Report a ``GRPOTrainer`` run to a studio (``url`` and ``token`` default to
    ``POSTTRAIN_URL`` and ``POSTTRAIN_TOKEN``).

    ``name`` is the studio experiment the run joins (default: ``args.run_name``, else the output
    folder's name); ``allow_cancel`` lets Cancel on the run's page stop training after the
    current step; ``completions`` sends the last generation's completions with each log.
    """

    def __init__(
        self,
        trainer: Any = None,
        *,
        url: str | None = None,
        token: str | None = None,
        name: str | None = None,
        allow_cancel: bool = False,
        completions: bool = True,
        tags: list[str] | tuple[str, ...] = (),
        heartbeat_s: float = 15.0,
        retry_for_s: float = 120.0,
        finish_timeout_s: float = 120.0,
    ) -> None:
        url = url or os.environ.get("POSTTRAIN_URL")
        token = token or os.environ.get("POSTTRAIN_TOKEN")
        if not url or not token:
            raise ValueError(
                "PostTrainCallback needs the studio and a token: pass url= and token= or set "
                "POSTTRAIN_URL and POSTTRAIN_TOKEN (make a token at /accounts/tokens/)"
            )
        self.trainer = trainer
        self.studio = Studio(url, token)
        self.name = name
        self.allow_cancel = allow_cancel
        self.completions = completions
        self.tags = list(tags)
        self.heartbeat_s = heartbeat_s
        self.retry_for_s = retry_for_s
        self.finish_timeout_s = finish_timeout_s
        self.run: ExternalRun | None = None
        self.sender: BackgroundSender | None = None
        self.cancel_requested = threading.Event()
        self.stopped_for_cancel = False
        self.finished = False
        self.last_generation: tuple[Any, ...] | None = None
        self.failure: str | None = None
        self._beat_stop = threading.Event()

    @classmethod
    def attach(cls, trainer: Any, **options: Any) -> PostTrainCallback:
        """Make the callback for ``trainer`` and add it to the trainer's callbacks."""
        callback = cls(trainer, **options)
        trainer.add_callback(callback)
        return callback

    # -- the run ---------------------------------------------------------------------------
    def _key(self, output_dir: Path) -> str:
        """Return the run key kept in the output folder, so a resumed training goes on in the
        same run while it is open."""
        path = output_dir / KEY_FILE
        if path.exists():
            return json.loads(path.read_text())["key"]
        key = new_key()
        output_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key}))
        return key

    def _open(self, args: Any, state: Any) -> None:
        from posttrain_client import __version__

        output_dir = Path(args.output_dir)
        name = self.name or getattr(args, "run_name", None) or output_dir.resolve().name
        fields = {
            "location": f"{socket.gethostname()}:{output_dir.resolve()}",
            "client": f"{CLIENT} {__version__}",
            "cancel_honoured": self.allow_cancel,
            "config": args.to_dict(),
            "total_steps": state.max_steps or None,
            "tags": self.tags,
        }
        opts = {"name": name, "source": "trl", "retry_for_s": self.retry_for_s, **fields}
        run = ExternalRun.create(self.studio, key=self._key(output_dir), **opts)
        if run.data["status"] not in ("running", "lost"):  # that run ended: report a new one
            (output_dir / KEY_FILE).unlink()
            run = ExternalRun.create(self.studio, key=self._key(output_dir), **opts)
        self.run = run
        logger.warning("posttrain: reporting to %s", run.url)

    def _beat(self) -> None:
        while not self._beat_stop.wait(self.heartbeat_s):
            try:
                assert self.run is not None
                if self.run.heartbeat()["cancel_requested"]:
                    self.cancel_requested.set()
            except (StudioError, StudioUnreachable) as exc:
                logger.warning("posttrain: heartbeat failed: %s", exc)

    def _record_failure(self, kind: Any, value: Any, tb: Any) -> None:
        self.failure = "".join(traceback.format_exception(kind, value, tb))
        self._previous_hook(kind, value, tb)

    def _at_exit(self) -> None:
        if self.run is not None and not self.finished:
            self._finish("failed", self.failure or "the process ended before training did")

    def _finish(self, status: str, error: str = "") -> None:
        self.finished = True
        self._beat_stop.set()
        assert self.run is not None and self.sender is not None
        run = self.run
        self.sender.put(lambda: run.finish(status, error))
        self.sender.close(self.finish_timeout_s)

    # -- TrainerCallback -------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self.run is not None:
            return
        self._open(args, state)
        self.sender = BackgroundSender()
        threading.Thread(target=self._beat, daemon=True, name="posttrain-heartbeat").start()
        self._previous_hook = sys.excepthook
        sys.excepthook = self._record_failure
        atexit.register(self._at_exit)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self.run is None or self.sender is None or not logs:
            return
        run, step = self.run, state.global_step
        metrics = metrics_of(logs)
        if self.completions and self.trainer is not None:
            samples = completions_of(self.trainer, step)
            generation = tuple((s["prompt"], s["response"]) for s in samples[:2]) + (len(samples),)
            if samples and generation != self.last_generation:
                self.last_generation = generation
                self.sender.put(lambda: run.samples(samples))
        if metrics:
            self.sender.put(lambda: run.steps([(step, metrics)]))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.allow_cancel and self.cancel_requested.is_set() and not self.stopped_for_cancel:
            logger.warning("posttrain: the studio asks to cancel the run: training stops")
            self.stopped_for_cancel = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is None or self.finished:
            return
        self._finish("cancelled" if self.stopped_for_cancel else "succeeded")
        sys.excepthook = self._previous_hook
