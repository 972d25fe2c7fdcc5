"""A weighted sum of named rewards, e.g. keyword 0.3 + reward model 0.7.

Each component is ``(name_or_fn, weight, kwargs)`` (``kwargs`` may be left out):

- a registered name (``"keyword"``, ``"gsm8k"``, ...) or a function with the uniform signature
  ``fn(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``, called with
  ``kwargs``; a dict result contributes its ``score`` and its other keys appear as
  ``<name>/<key>``;
- ``"reward_model"`` (the ``reward_model`` scorer given to the composite) or a scorer object
  (anything with ``score(prompts, responses) -> list[float]``, such as ``RewardModelScorer``):
  scored for the whole batch at once, on (prompt, response) pairs; a generative judge
  (``engine.rewards.judge.JudgeScorer``) is given each sample's fields (its template may show the
  ground truth) and fails only the samples it cannot score, its reply kept as
  ``<name>/judge_text`` whether it scored or not.

The result is ``{"score": sum(weight * part), "score/<name>": part, ...}``. Weights are used as
given, not normalised, so a part's weight is its exchange rate into the total. Two components
with the same name are told apart as ``name``, ``name_2``, ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from engine.rewards.batch import RewardInput, RewardOutcome, describe_error, score_samples
from engine.rewards.registry import get_reward_fn

REWARD_MODEL = "reward_model"
JUDGE_TEXT = "judge_text"  # a judge's reply, kept per sample as ``<component>/judge_text``


class Scorer(Protocol):
    """Scores (prompt, response) pairs in batch, like ``RewardModelScorer``."""

    def score(self, prompts: Sequence[Any], responses: Sequence[str]) -> list[float]: ...


@runtime_checkable
class Judge(Protocol):
    """A scorer that judges each sample with its fields and keeps its reply, like
    ``engine.rewards.judge.JudgeScorer``: one ``Judgement`` (score, error, text) per sample."""

    def judge(self, samples: Sequence[RewardInput], prompts: Sequence[Any]) -> list[Any]: ...


def _is_scorer(obj: Any) -> bool:
    # Scorers are objects with a score method; reward functions are plain callables.
    return not callable(obj) and callable(getattr(obj, "score", None))


@dataclass(frozen=True)
class _RuleComponent:
    name: str
    fn: Callable[..., Any]
    weight: float
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _ModelComponent:
    name: str
    scorer: Scorer
    weight: float


@dataclass(frozen=True)
class RuleParts:
    """The rule-based components of a composite, scored per sample; picklable for workers."""

    components: tuple[_RuleComponent, ...]

    def __call__(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: Any,
        extra_info: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Return ``{"score": weighted rule subtotal, name: score, name/key: part}`` for a sample."""
        parts: dict[str, Any] = {}
        for c in self.components:
            result = c.fn(data_source, solution_str, ground_truth, extra_info, **c.kwargs)
            if isinstance(result, dict):
                parts[c.name] = float(result["score"])
                parts.update({f"{c.name}/{k}": v for k, v in result.items() if k != "score"})
            else:
                parts[c.name] = float(result)
        subtotal = sum(c.weight * parts[c.name] for c in self.components)
        return {"score": subtotal, **parts}


class CompositeReward:
    """Weighted sum of rule-based rewards and reward-model scores."""

    def __init__(
        self,
        components: Sequence[tuple[Any, ...]],
        *,
        reward_model: Scorer | None = None,
    ) -> None:
        if not components:
            raise ValueError("a composite reward needs at least one (name_or_fn, weight, kwargs)")
        rules: list[_RuleComponent] = []
        models: list[_ModelComponent] = []
        names: list[str] = []
        for spec in components:
            if not isinstance(spec, tuple | list) or len(spec) not in (2, 3):
                raise ValueError(
                    f"composite component {spec!r} must be (name_or_fn, weight) or "
                    "(name_or_fn, weight, kwargs)"
                )
            target, weight = spec[0], float(spec[1])
            kwargs = dict(spec[2]) if len(spec) == 3 and spec[2] else {}
            if _is_scorer(target) or target == REWARD_MODEL:
                scorer = target if _is_scorer(target) else reward_model
                if scorer is None:
                    raise ValueError(
                        "component 'reward_model' needs a scorer: pass "
                        "reward_model=RewardModelScorer(model_path) to the composite"
                    )
                if kwargs:
                    raise ValueError(f"a reward-model component takes no kwargs, got {kwargs}")
                name = self._unique(REWARD_MODEL, names)
                models.append(_ModelComponent(name, scorer, weight))
            elif isinstance(target, str):
                rules.append(
                    _RuleComponent(
                        self._unique(target, names), get_reward_fn(target), weight, kwargs
                    )
                )
            elif callable(target):
                base = getattr(target, "__name__", type(target).__name__)
                rules.append(_RuleComponent(self._unique(base, names), target, weight, kwargs))
            else:
                raise TypeError(
                    f"composite component {target!r} is neither a registered reward name, a "
                    "function nor a scorer with a score(prompts, responses) method"
                )
        self.rules = RuleParts(tuple(rules))
        self.models = tuple(models)
        self.weights = {c.name: c.weight for c in rules} | {m.name: m.weight for m in models}

    @staticmethod
    def _unique(base: str, taken: list[str]) -> str:
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken.append(name)
        return name

    def _combine(self, parts: dict[str, Any]) -> dict[str, Any]:
        """Return the weighted total and every part under ``score/<name>``."""
        total = sum(weight * parts[name] for name, weight in self.weights.items())
        result: dict[str, Any] = {"score": total}
        for key, value in parts.items():
            if key == "score":  # the rule subtotal; the total replaces it
                continue
            result[f"score/{key}" if key in self.weights else key] = value
        return result

    def __call__(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: Any,
        extra_info: dict[str, Any] | None = None,
        *,
        prompt_text: str = "",
    ) -> dict[str, Any]:
        """Score one sample; the reward model (if any) sees ``prompt_text`` and the response."""
        parts = self.rules(data_source, solution_str, ground_truth, extra_info)
        for m in self.models:
            parts[m.name] = m.scorer.score([prompt_text], [solution_str])[0]
        return self._combine(parts)

    def score_batch(
        self,
        samples: Sequence[RewardInput],
        prompts: Sequence[Any] | None = None,
        executor: Executor | None = None,
    ) -> list[RewardOutcome]:
        """Score a batch: rules per sample (in ``executor`` when given), each model in one batch."""
        outcomes = (
            score_samples(self.rules, samples, executor)
            if self.rules.components
            else [RewardOutcome({}, None) for _ in samples]
        )
        model_parts: dict[str, list[float]] = {}
        judged: dict[str, list[Any]] = {}  # a judge's Judgement per sample
        model_error = None
        if self.models:
            if prompts is None or len(prompts) != len(samples):
                raise ValueError(
                    "a composite with a reward model needs one prompt text per sample; pass "
                    "prompts (the manager takes them from prompt_text or decodes data.batch['prompts'])"
                )
            try:
                responses = [s.solution_str for s in samples]
                for m in self.models:
                    if isinstance(m.scorer, Judge):
                        judged[m.name] = m.scorer.judge(samples, list(prompts))
                    else:
                        model_parts[m.name] = m.scorer.score(list(prompts), responses)
            except Exception as exc:  # a model failure fails the batch's samples, not the step
                model_error = describe_error(exc)
        combined = []
        for i, outcome in enumerate(outcomes):
            # A judge's reply is kept even when the sample failed: it says why.
            texts = {f"{name}/{JUDGE_TEXT}": j[i].text for name, j in judged.items()}
            errors = [outcome.error, model_error, *(j[i].error for j in judged.values())]
            error = next((e for e in errors if e is not None), None)
            if error is not None:
                combined.append(RewardOutcome(texts or None, error))
                continue
            parts = dict(outcome.result)  # type: ignore[arg-type]
            parts.update({name: scores[i] for name, scores in model_parts.items()})
            parts.update({name: j[i].score for name, j in judged.items()})
            combined.append(RewardOutcome({**self._combine(parts), **texts}, None))
        return combined
