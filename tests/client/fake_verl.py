"""Write files as a verl run does, for the watcher's tests: verl's own writers, copied.

``FileLogger.log`` is ``verl/utils/tracking.py``'s (orjson with ``OPT_SERIALIZE_NUMPY``, one
``{"step": N, "data": {...}}`` line per call, the file opened with ``"wb"`` unbuffered, its path
from ``VERL_FILE_LOGGER_PATH``); ``dump_generations`` is ``RayPPOTrainer._dump_generations`` of
``verl/trainer/ppo/ray_trainer.py`` (``<step>.jsonl``, ``json.dumps(entry, ensure_ascii=False)``
per line, the file written whole). ``fit`` follows ``RayPPOTrainer.fit``'s order: validation
before training logged at step 0, then per step the rollout dump, the validation dump every
``test_freq`` steps and at the last, then the step's log line.

Run as a script it is a stand-in for ``python -m verl.trainer.main_ppo`` that reads the same
overrides (``trainer.rollout_data_dir=...``, ``trainer.validation_data_dir=...``,
``trainer.total_training_steps=...``, ``trainer.test_freq=...``) and prints a line per step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
import orjson

PROMPTS = ["What is 2+3?", "What is 7*6?", "Name a prime above 10."]
N = 4  # actor_rollout_ref.rollout.n


class FileLogger:
    """``verl.utils.tracking.FileLogger``, as verl writes it."""

    def __init__(self, path: str) -> None:
        self.fp = open(path, "wb", buffering=0)  # noqa: SIM115 - verl keeps it open

    def log(self, data: dict[str, Any], step: int) -> None:
        data = {"step": step, "data": data}
        self.fp.write(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")

    def finish(self) -> None:
        self.fp.close()


def dump_generations(step, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
    """``RayPPOTrainer._dump_generations``, as verl writes it."""
    os.makedirs(dump_path, exist_ok=True)
    filename = os.path.join(dump_path, f"{step}.jsonl")
    n = len(inputs)
    base_data = {
        "input": inputs,
        "output": outputs,
        "gts": gts,
        "score": scores,
        "step": [step] * n,
    }
    for k, v in reward_extra_infos_dict.items():
        if len(v) == n:
            base_data[k] = v
    lines = []
    for i in range(n):
        entry = {k: v[i] for k, v in base_data.items()}
        lines.append(json.dumps(entry, ensure_ascii=False))
    with open(filename, "w") as f:
        f.write("\n".join(lines) + "\n")


def rollouts(step: int, shuffle: bool = True) -> tuple[list, list, list, list, dict]:
    """Return one step's rollouts: N responses per prompt, reordered as ``_balance_batch`` does."""
    rows = [(p, i) for p in range(len(PROMPTS)) for i in range(N)]
    if shuffle:
        rows = rows[1::2] + rows[0::2]
    inputs = [PROMPTS[p] for p, _ in rows]
    outputs = [f"step {step} answer {p}.{i}" for p, i in rows]
    scores = [float((p + i + step) % 2) for p, i in rows]
    gts = [["5", "42", "11"][p] if p < 2 else {"any_of": [11, 13]} for p, _ in rows]
    extras = {"acc": [bool(s) for s in scores], "pred": [o[-3:] for o in outputs]}
    return inputs, outputs, gts, scores, extras


def step_metrics(step: int) -> dict[str, Any]:
    """Return metrics as verl logs them: floats, numpy scalars, an int, a NaN."""
    return {
        "critic/score/mean": np.float32(0.25 + step / 100),
        "actor/pg_loss": -0.01 * step,
        "actor/entropy": np.float64(1.5),
        "actor/kl_loss": float("nan") if step == 2 else 0.001 * step,
        "response_length/mean": 12.0 + step,
        "training/global_step": step,
        "timing_s/step": 0.05,
    }


def fit(log_path: str, rollout_dir: str, val_dir: str | None, total: int, test_freq: int,
        pause_s: float = 0.0) -> None:  # fmt: skip
    """Write a whole run in ``RayPPOTrainer.fit``'s order."""
    logger = FileLogger(log_path)
    if val_dir:
        inputs, outputs, gts, scores, extras = rollouts(0, shuffle=False)
        dump_generations(0, inputs, outputs, gts, scores, {"reward": scores, **extras}, val_dir)
        logger.log({"val-core/arith/reward/mean@1": 0.5}, step=0)
    for step in range(1, total + 1):
        time.sleep(pause_s)
        dump_generations(step, *rollouts(step), rollout_dir)
        metrics = step_metrics(step)
        if val_dir and (step % test_freq == 0 or step == total):
            inputs, outputs, gts, scores, extras = rollouts(step, shuffle=False)
            dump_generations(
                step, inputs, outputs, gts, scores, {"reward": scores, **extras}, val_dir
            )
            metrics["val-core/arith/reward/mean@1"] = sum(scores) / len(scores)
        logger.log(metrics, step=step)
        print(f"Training Progress: step {step}/{total}", flush=True)
    logger.finish()


def main(argv: list[str]) -> int:
    overrides = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    total = int(overrides.get("trainer.total_training_steps", "3"))
    fit(
        os.environ["VERL_FILE_LOGGER_PATH"],
        overrides["trainer.rollout_data_dir"],
        overrides.get("trainer.validation_data_dir"),
        total,
        int(overrides.get("trainer.test_freq", "2")),
        float(overrides.get("pause_s", "0")),
    )
    if overrides.get("fail") == "1":
        print("Traceback (most recent call last):\nRuntimeError: CUDA out of memory", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
