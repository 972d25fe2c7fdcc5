"""A generative judge on the tiny model: rewards per second batched and one by one, and a short
GRPO run whose reward is the judge's score, to see the policy move toward the judge's preference.

The judge is the embedded tiny model (``tiny://model``), which learned to add two numbers. Its
prompt is ``{response}+0=`` and its reply is parsed as a number, so the judge prefers larger
answers: it reads a response ``n`` as about ``n`` (the script measures how often it says exactly
``n`` for n in 0..99). That preference is known without reading the judge's weights, and it
pulls against the task's own reward (the right sum), so a policy that follows the judge writes
larger numbers and loses held-out accuracy.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.training.judge_reward speed --responses 256
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.training.judge_reward learn --steps 40

``speed`` scores the same responses with the judge's batch (``reward_model.rollout.max_num_seqs``)
at 64 and at 1, alternating arms, and checks that both give the same replies (greedy).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time
from typing import Any

from engine.config import load_config
from engine.rewards.batch import RewardInput

TEMPLATE = "{response}+0="


def judge_overrides(new_tokens: int, batch: int) -> list[str]:
    return [
        "reward_model.enable=True",
        "reward_model.model.path=tiny://model",
        f"reward_model.judge.prompt_template='{TEMPLATE}'",
        f"reward_model.rollout.response_length={new_tokens}",
        "reward_model.rollout.prompt_length=32",
        f"reward_model.rollout.max_num_seqs={batch}",
    ]


def build_judge(new_tokens: int, batch: int) -> Any:
    from engine.trainer.build import build_reward_scorer

    return build_reward_scorer(load_config("grpo_tiny", judge_overrides(new_tokens, batch)))


def speed(args: argparse.Namespace) -> None:
    rng = random.Random(0)
    samples = [
        RewardInput("tiny_arithmetic", str(rng.randint(0, 198)), None, None)
        for _ in range(args.responses)
    ]
    prompts = [""] * len(samples)
    judge = build_judge(args.new_tokens, 64)
    times: dict[int, list[float]] = {64: [], 1: []}
    replies: dict[int, list[Any]] = {}
    judge.judge(samples[:8], prompts[:8])  # warm up
    for _ in range(args.rounds):
        for batch in (64, 1):
            judge.batch_size = batch
            start = time.perf_counter()
            replies[batch] = judge.judge(samples, prompts)
            times[batch].append(time.perf_counter() - start)
    assert replies[64] == replies[1], "batching changed the judge's replies"
    errors = sum(j.error is not None for j in replies[64])
    print(
        f"{args.responses} responses, {args.new_tokens} new tokens at most, {errors} parse errors"
    )
    print("| arm | ms per batch of responses | rewards/s |")
    print("| --- | ---: | ---: |")
    for batch, label in ((64, "batched, 64 a generate call"), (1, "one by one")):
        ms = statistics.median(times[batch]) * 1000
        print(f"| {label} | {ms:.1f} | {args.responses / ms * 1000:,.0f} |")
    ratio = statistics.median(times[1]) / statistics.median(times[64])
    print(f"batched is {ratio:.1f}x one by one")


class Capture:
    """A recorder keeping each step's metrics and the train responses' numeric values."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.values: dict[int, list[float]] = {}
        self.val: dict[int, float] = {}

    def on_start(self, **_: Any) -> None: ...
    def on_checkpoint(self, *_: Any) -> None: ...
    def on_finish(self, **_: Any) -> None: ...
    def should_stop(self) -> bool:
        return False

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.metrics[step] = dict(metrics)

    def on_samples(self, step: int, samples: list[Any]) -> None:
        if samples and samples[0].split == "val":
            right = [s.reward for s in samples]
            self.val[step] = sum(right) / len(right)
            return
        numbers = [re.match(r"\s*(\d+)", s.response_text) for s in samples]
        self.values[step] = [float(m.group(1)) for m in numbers if m]


def learn(args: argparse.Namespace) -> None:
    from engine.trainer.reporting import Recorder
    from engine.trainer.run import run_training

    judge = build_judge(4, 64)
    grid = [RewardInput("tiny_arithmetic", str(n), None, None) for n in range(100)]
    said = judge.judge(grid, [""] * 100)
    scores = [j.score if j.score is not None else float("nan") for j in said]
    exact = sum(score == n for n, score in enumerate(scores))
    print(
        f"judge preference over n in 0..99: correlation of score with n "
        f"{statistics.correlation(list(map(float, range(100))), scores):.2f}; says exactly n "
        f"{exact} times; {sum(j.error is not None for j in said)} parse errors"
    )
    config = load_config(
        "grpo_tiny",
        [
            *judge_overrides(4, 256),
            f"trainer.total_training_steps={args.steps}",
            f"trainer.test_freq={args.steps}",
            f"trainer.seed={args.seed}",
            "trainer.logger=[]",
            f"trainer.default_local_dir={args.work}",
        ],
    )
    capture = Capture()
    recorder = Recorder()
    for name in ("on_start", "on_step", "on_samples", "on_checkpoint", "on_finish", "should_stop"):
        setattr(recorder, name, getattr(capture, name))
    start = time.perf_counter()
    run_training(config, recorder)
    elapsed = time.perf_counter() - start
    steps = sorted(capture.metrics)
    first, last = steps[:5], steps[-5:]

    def mean_of(key: str, which: list[int]) -> float:
        return statistics.mean(capture.metrics[s][key] for s in which if key in capture.metrics[s])

    def value(which: list[int]) -> float:
        return statistics.mean(v for s in which for v in capture.values.get(s, []))

    print(f"{args.steps} steps in {elapsed:.0f}s, seed {args.seed}")
    print("| | steps 1-5 | last 5 steps |")
    print("| --- | ---: | ---: |")
    print(
        f"| judge score (train mean) | {mean_of('critic/score/mean', first):.1f} | "
        f"{mean_of('critic/score/mean', last):.1f} |"
    )
    print(f"| the policy's answer (mean value) | {value(first):.1f} | {value(last):.1f} |")
    val = sorted(capture.val)
    print(
        f"held-out accuracy (the task's own reward): step {val[0]}: {capture.val[val[0]]:.3f}, "
        f"step {val[-1]}: {capture.val[val[-1]]:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("speed", help="judge rewards per second, batched and one by one")
    s.add_argument("--responses", type=int, default=256)
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--new-tokens", type=int, default=4)
    s.set_defaults(run=speed)
    learn_parser = sub.add_parser("learn", help="GRPO with the judge's score as the reward")
    learn_parser.add_argument("--steps", type=int, default=40)
    learn_parser.add_argument("--seed", type=int, default=1)
    learn_parser.add_argument("--work", default="/tmp/judge_learn")
    learn_parser.set_defaults(run=learn)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
