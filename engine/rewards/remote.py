"""The remote reward manager (``reward_model.reward_manager=remote``): score a batch by posting it
to a reward service the administrator allows.

verl's ``remote`` manager sends each response to a reward function in another (Ray) process;
here the other process is a service over HTTP, so a team can score with a verifier, a judge or
a grader it runs elsewhere. The service is named by ``+reward_model.reward_kwargs.endpoint``: an
entry of ``POSTTRAIN_REWARD_ENDPOINTS`` (``engine.rewards.endpoints``), by its name or exact
URL; any other address is refused when the config is checked and again here.

The request is verl's batch reward function's arguments as JSON, one list entry per response::

    POST <url>  {"data_sources": [...], "solution_strs": [...], "ground_truths": [...],
                 "extra_infos": [...]}

and the answer is what that function returns: a JSON list with one entry per response, in
order, each a number or an object with a ``"score"`` number (its other keys become
``reward_extra_info``, as in the naive manager). A batch goes out in requests of at most
``batch_size`` responses (default 64), at most ``max_concurrent`` of them in flight (default 4),
each try within ``timeout`` seconds (default 30), retried ``max_retries`` times (default 2) after
``backoff_s`` seconds doubling (default 0.5), and with ``max_rpm`` no more than that many tries a
minute for the run (``engine.rewards.service``).

A bad answer is an error that names the service: not reached or too slow after the retries, an
HTTP error, a body that is not JSON, not a list, a list of the wrong length, an entry that is not
a finite number or an object with one (NaN and infinities included). ``on_error`` says what the
run does then: ``reward_error`` (default) fails the responses of that request, each scoring 0
with its ``reward_error`` and counted in ``reward/failed``, as the other managers fail a response
whose function raised; ``fail`` stops the run with the error.

Each call's requests, retries and seconds waiting on the service are in its ``meta_info``
(``reward_remote_requests``, ``reward_remote_retries``, ``reward_remote_s``).
"""

from __future__ import annotations

import math
import time
from typing import Any, Unpack

import torch

from engine.config.reward_kwargs import reward_kwargs_problems
from engine.rewards.batch import RewardInput, RewardOutcome, check_result
from engine.rewards.endpoints import resolve_endpoint
from engine.rewards.manager import RewardManager, RewardSources, refuse_components
from engine.rewards.service import ServiceClient, ServiceError

DEFAULT_BATCH_SIZE = 64


class RemoteRewardManager(RewardManager):
    """Score a rollout batch with requests to one allowed reward service."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        endpoint: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        max_concurrent: int = 4,
        max_rpm: float | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_error: str = "reward_error",
        **sources: Unpack[RewardSources],
    ) -> None:
        refuse_components("remote", "with its reward service alone", sources)
        if sources.get("compute_score") is not None:
            raise ValueError(
                "reward_model.reward_manager=remote scores with its reward service; unset "
                "custom_reward_function.path, or use reward_manager=batch to call it"
            )
        if sources.get("num_workers", 1) != 1:
            raise ValueError(
                "reward_model.reward_manager=remote sends requests from this process, at most "
                "reward_kwargs.max_concurrent at once; set reward.num_workers to 1"
            )
        settings = {
            "endpoint": endpoint,
            "timeout": timeout,
            "max_retries": max_retries,
            "backoff_s": backoff_s,
            "max_concurrent": max_concurrent,
            "max_rpm": max_rpm,
            "batch_size": batch_size,
            "on_error": on_error,
        }
        problems = reward_kwargs_problems("remote", settings)
        if problems:
            raise ValueError("; ".join(f"{key} {message}" for key, message in problems))
        super().__init__(tokenizer, reward_fn_key=sources.get("reward_fn_key", "data_source"))
        self.client = ServiceClient(
            resolve_endpoint(endpoint),
            timeout=timeout,
            max_retries=max_retries,
            backoff_s=backoff_s,
            max_concurrent=max_concurrent,
            max_rpm=max_rpm,
        )
        self.batch_size = int(batch_size)
        self.on_error = on_error

    def _score(self, samples: list[RewardInput], data: Any) -> list[RewardOutcome]:
        chunks = [
            samples[start : start + self.batch_size]
            for start in range(0, len(samples), self.batch_size)
        ]
        outcomes: list[RewardOutcome] = []
        for chunk in self.client.map(self._score_chunk, chunks):
            outcomes.extend(chunk)
        return outcomes

    def _score_chunk(self, samples: list[RewardInput]) -> list[RewardOutcome]:
        try:
            answer = self.client.post(
                {
                    "data_sources": [s.data_source for s in samples],
                    "solution_strs": [s.solution_str for s in samples],
                    "ground_truths": [s.ground_truth for s in samples],
                    "extra_infos": [s.extra_info for s in samples],
                }
            )
            return [RewardOutcome(r, None) for r in self._check(answer, len(samples))]
        except ServiceError as exc:
            if self.on_error == "fail":
                raise
            failed = RewardOutcome(None, f"ServiceError: {exc}")
            return [failed] * len(samples)

    def _check(self, answer: Any, n: int) -> list[float | dict[str, Any]]:
        """Return one checked score per response; raise ServiceError naming the service."""
        expected = (
            f"it must answer a JSON list of {n} scores (numbers, or objects with a 'score' "
            "number), one per response in order"
        )
        if not isinstance(answer, list):
            raise self.client.error(
                f"answered a JSON {type(answer).__name__} instead of a list; {expected}"
            )
        if len(answer) != n:
            raise self.client.error(f"answered {len(answer)} scores for {n} responses; {expected}")
        checked = []
        for i, entry in enumerate(answer):
            try:
                result = check_result(entry)
            except (TypeError, ValueError) as exc:
                raise self.client.error(f"answered {entry!r} for response {i}: {exc}") from None
            score = result["score"] if isinstance(result, dict) else result
            if isinstance(entry, bool) or not math.isfinite(score):
                raise self.client.error(
                    f"answered {entry!r} for response {i}, which is not a finite score; {expected}"
                )
            checked.append(result)
        return checked

    def __call__(self, data: Any, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """Score as :class:`RewardManager` does; the meta info adds the service's counts."""
        requests, retries = self.client.requests, self.client.retries
        start = time.perf_counter()
        out = super().__call__(data, return_dict=return_dict)
        if isinstance(out, dict):
            out["meta_info"].update(
                reward_remote_requests=self.client.requests - requests,
                reward_remote_retries=self.client.retries - retries,
                reward_remote_s=time.perf_counter() - start,
            )
        return out
