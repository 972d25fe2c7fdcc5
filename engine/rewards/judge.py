"""A generative reward model (LLM-as-judge): an LLM reads each response and its reply is the score.

Each sample's judge prompt is the configured template over the sample's prompt, response, ground
truth and data source (``engine.rewards.judge_prompt``); the judge model generates a reply through
one of the rollout backends (``engine.roles.model_loading.load_judge`` builds the generator:
``hf`` on a CPU or GPU, ``vllm`` where installed), and the parser turns the reply into a score.
The reply is kept beside the score (``<component>/judge_text``) so the sample inspector shows why
a response scored as it did.

Batching and limits follow verl's reward loop. The judge's server takes ``max_num_seqs``
sequences a step (``reward_model.rollout.max_num_seqs``), so prompts go to the generator in
batches of that size: the number of requests in flight at once (verl's ``limited`` manager's
``max_concurrent``). Before each batch, token buckets hold the request and token rates
(``max_rpm``, ``max_tpm`` with ``estimated_tokens_per_request``; :class:`TokenBucket` is verl's
``AsyncTokenBucket``, synchronous). ``timeout`` bounds one call's judging: a batch that would
start (its rate-limit wait included) after the deadline is not generated, and its samples are
reward errors (``TimeoutError``), as are replies the parser cannot read (``JudgeParseError``)
and prompts the generator refuses (too long). verl's ``limited`` manager scores a timed-out or
failed sample 0 with a flag; here every such sample is a recorded reward error, counted in
``reward/failed`` and shown in the inspector, never a silent 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from engine.rewards.batch import RewardInput, describe_error
from engine.rewards.judge_prompt import build_parser, render_template, template_problem

# The generator: judge prompts in, one reply text (or the error that replaced it) per prompt out.
JudgeGenerate = Callable[[list[str]], list["str | BaseException"]]


class Judgement(NamedTuple):
    """One sample's judging: the score, or the error that replaced it, and the judge's reply."""

    score: float | None
    error: str | None
    text: str | None


class TokenBucket:
    """A token bucket of ``rate`` tokens a second holding at most one second's worth, as verl's
    ``AsyncTokenBucket``; a request for more than the bucket holds drives the balance negative
    (it waits for the whole amount, and later requests wait for the debt)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0:
            raise ValueError(f"a token bucket's rate must be > 0, got {rate}")
        self.rate = rate
        self.capacity = rate
        self.tokens = rate
        self.clock = clock
        self.last = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = now

    def wait_time(self, amount: float) -> float:
        """Return the seconds until ``amount`` tokens may be taken."""
        self._refill()
        # More than the bucket holds waits for a full bucket, then runs into debt (as verl).
        return max(0.0, (min(amount, self.capacity) - self.tokens) / self.rate)

    def take(self, amount: float) -> None:
        """Take ``amount`` tokens (call after waiting :meth:`wait_time`)."""
        self._refill()
        self.tokens -= amount


def prompt_as_text(prompt: Any) -> str:
    """Return a prompt as text: a string as is, chat messages as their contents, one a line."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))


class JudgeScorer:
    """Score responses with a generative judge: template, generate in batches, parse."""

    def __init__(
        self,
        generate: JudgeGenerate,
        *,
        template: str,
        parser: str = "number",
        verdicts: dict[str, float] | None = None,
        batch_size: int = 64,
        max_rpm: float | None = None,
        max_tpm: float | None = None,
        estimated_tokens_per_request: int = 2000,
        timeout: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        problem = template_problem(template)
        if problem is not None:
            raise ValueError(f"reward_model.judge.prompt_template {problem}")
        self.generate = generate
        self.template = template
        self.parse = build_parser(parser, verdicts)
        self.batch_size = batch_size
        self.timeout = timeout
        self.clock, self.sleep = clock, sleep
        # verl's limits are per minute; its buckets (and these) refill per second.
        self.requests = TokenBucket(max_rpm / 60.0, clock) if max_rpm else None
        self.tokens = TokenBucket(max_tpm / 60.0, clock) if max_tpm else None
        self.tokens_per_request = estimated_tokens_per_request

    def judge_prompts(
        self, samples: Sequence[RewardInput], prompts: Sequence[Any] | None = None
    ) -> list[str]:
        """Return each sample's judge prompt (the template over its fields)."""
        prompts = prompts if prompts is not None else [""] * len(samples)
        return [
            render_template(
                self.template,
                {
                    "prompt": prompt_as_text(p),
                    "response": s.solution_str,
                    "ground_truth": s.ground_truth,
                    "data_source": s.data_source,
                },
            )
            for s, p in zip(samples, prompts, strict=True)
        ]

    def _wait(self, n: int) -> float:
        """Return the seconds the rate limits make a batch of ``n`` requests wait."""
        waits = [0.0]
        if self.requests is not None:
            waits.append(self.requests.wait_time(n))
        if self.tokens is not None:
            waits.append(self.tokens.wait_time(n * self.tokens_per_request))
        return max(waits)

    def _take(self, n: int) -> None:
        if self.requests is not None:
            self.requests.take(n)
        if self.tokens is not None:
            self.tokens.take(n * self.tokens_per_request)

    def judge(
        self, samples: Sequence[RewardInput], prompts: Sequence[Any] | None = None
    ) -> list[Judgement]:
        """Return one :class:`Judgement` per sample, in order."""
        texts = self.judge_prompts(samples, prompts)
        deadline = self.clock() + self.timeout
        results: list[Judgement] = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            wait = self._wait(len(batch))
            if self.clock() + wait > deadline:
                error = (
                    f"TimeoutError: the judge did not reach this sample within "
                    f"reward_model.timeout={self.timeout:g}s ({start} of {len(texts)} judged)"
                )
                results += [Judgement(None, error, None)] * (len(texts) - start)
                break
            if wait > 0:
                self.sleep(wait)
            self._take(len(batch))
            try:
                replies = self.generate(batch)
            except Exception as exc:  # the batch's samples fail, not the step
                results += [Judgement(None, describe_error(exc), None)] * len(batch)
                continue
            results += [self._parse(reply) for reply in replies]
        return results

    def _parse(self, reply: str | BaseException) -> Judgement:
        if isinstance(reply, BaseException):
            return Judgement(None, describe_error(reply), None)
        try:
            return Judgement(self.parse(reply), None, reply)
        except ValueError as exc:
            return Judgement(None, describe_error(exc), reply)

    def score(self, prompts: Sequence[Any], responses: Sequence[str]) -> list[float]:
        """Return one score per (prompt, response) pair; raise on the first failed sample."""
        samples = [RewardInput("", r, None, None) for r in responses]
        scores = []
        for judgement in self.judge(samples, prompts):
            if judgement.score is None:
                raise RuntimeError(f"the judge could not score a response: {judgement.error}")
            scores.append(judgement.score)
        return scores
