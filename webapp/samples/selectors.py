"""Read queries of the sample inspector; every one is filtered by the run's owner.

The inspector reads one slice of a run at a time, and each slice is a prefix of an index that
``Sample`` already has, so a view costs the same with 2,000 or 200,000 samples in the run:

- step view and group view: ``sample_by_step`` (run, split, step, prompt_index, sample_index);
  the rows of one step are sorted by reward, advantage or length in memory (a step holds
  ``train_batch_size * rollout.n`` rows) and paginated with LIMIT/OFFSET;
- the list of steps: a recursive query that hops from step to step down ``sample_by_step``
  (one index probe per step instead of reading every row);
- across steps: ``sample_by_prompt`` (run, prompt_index, step);
- the whole run (the worst or best responses of every step): the step view's query without its
  step, sorted in PostgreSQL and read a page at a time (one scan of the run's rows of a split);
- recurring prompts (training prompts seen again in later epochs, by how their mean reward
  changed): one aggregate over the run's rows of a split, grouped by prompt and step;
- across runs: the same prompt is the same prompt *text* in the same split; it is looked up at
  the reference's ``prompt_index`` first (same dataset, indexed) and by text otherwise.

The per-token arrays are large and deferred everywhere except the group view, which colours
tokens. Non-finite values (a NaN reward from a failed reward function) stay out of means and
sort last.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Avg, Count, F, FloatField, Q, QuerySet, Value
from django.db.models.functions import NullIf

from webapp.projects.access import visible_runs
from webapp.runs.models import (
    SAMPLE_SCALAR_FIELDS,
    SAMPLE_TOKEN_FIELDS,
    Run,
    Sample,
    SampleSplit,
)
from webapp.samples.tokens import decode_tokens, response_pieces

# verl's GRPO divides by (std + epsilon) with torch's unbiased std.
GRPO_EPSILON = 1e-6
TOKEN_FIELDS = SAMPLE_TOKEN_FIELDS
SORTS = {
    "position": "prompt and sample index",
    "-reward": "reward, highest first",
    "reward": "reward, lowest first",
    "-advantage": "advantage, highest first",
    "advantage": "advantage, lowest first",
    "-length": "response length, longest first",
    "length": "response length, shortest first",
}
_SORT_COLUMNS = {"reward": "reward_sort", "advantage": "advantage", "length": "response_length"}
_NAN = Value(float("nan"), output_field=FloatField())


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def reward_stats(rewards: Iterable[float | None]) -> tuple[float | None, float | None]:
    """Return the mean and unbiased std of the finite rewards (std None below two values)."""
    values = [v for v in (_finite(r) for r in rewards) if v is not None]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def owned_samples(*, user: Any) -> QuerySet[Sample]:
    """Return every sample of the runs ``user`` may read (the root of all inspector queries)."""
    return Sample.objects.filter(run__in=visible_runs(user).values("pk"))


# -- step view ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleFilter:
    """What the step view and the exports select: a split, one step or all, and row filters."""

    split: str = SampleSplit.TRAIN
    step: int | None = None  # None: every step
    reward_min: float | None = None
    reward_max: float | None = None
    text: str = ""
    truncated_only: bool = False
    sort: str = "position"

    def __post_init__(self) -> None:
        if self.split not in SampleSplit.values:
            raise ValueError(f"split={self.split!r} is unknown; use one of {SampleSplit.values}")
        if self.sort not in SORTS:
            raise ValueError(f"sort={self.sort!r} is unknown; use one of {sorted(SORTS)}")
        if self.step is not None and self.step < 0:
            raise ValueError(f"step={self.step} is negative; steps count from 0")
        low, high = self.reward_min, self.reward_max
        if low is not None and high is not None and low > high:
            raise ValueError(f"reward_min={low} is above reward_max={high}; swap them or drop one")


def sample_filter_queryset(*, user: Any, run_id: int, filters: SampleFilter) -> QuerySet[Sample]:
    """Return the samples of ``user``'s run that pass ``filters``, sorted, token arrays deferred."""
    samples = owned_samples(user=user).filter(run_id=run_id, split=filters.split)
    if filters.step is not None:
        samples = samples.filter(step=filters.step)
    if filters.reward_min is not None or filters.reward_max is not None:
        samples = samples.exclude(reward=float("nan"))  # PostgreSQL sorts NaN above every number
    if filters.reward_min is not None:
        samples = samples.filter(reward__gte=filters.reward_min)
    if filters.reward_max is not None:
        samples = samples.filter(reward__lte=filters.reward_max)
    if filters.text:
        samples = samples.filter(
            Q(prompt_text__icontains=filters.text) | Q(response_text__icontains=filters.text)
        )
    if filters.truncated_only:
        samples = samples.filter(truncated=True)
    samples = samples.defer(*TOKEN_FIELDS).annotate(reward_sort=NullIf("reward", _NAN))
    position = ("step", "prompt_index", "sample_index", "id")
    if filters.sort == "position":
        return samples.order_by(*position)
    name = filters.sort.lstrip("-")
    column = F(_SORT_COLUMNS[name])
    key = (
        column.desc(nulls_last=True)
        if filters.sort.startswith("-")
        else column.asc(nulls_last=True)
    )
    return samples.order_by(key, *position)


@dataclass(frozen=True)
class SamplePage:
    """One page of the step view."""

    samples: list[Sample]
    number: int
    per_page: int
    count: int

    @property
    def num_pages(self) -> int:
        return max(1, math.ceil(self.count / self.per_page))

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.num_pages

    @property
    def start_index(self) -> int:
        return (self.number - 1) * self.per_page + 1 if self.samples else 0

    @property
    def end_index(self) -> int:
        return self.start_index + len(self.samples) - 1 if self.samples else 0


def sample_page(
    *, user: Any, run_id: int, filters: SampleFilter, page: int = 1, per_page: int = 50
) -> SamplePage:
    """Return page ``page`` (from 1) of the filtered samples; a page past the end is the last."""
    if page < 1 or per_page < 1:
        raise ValueError(f"page={page} and per_page={per_page} must be at least 1")
    samples = sample_filter_queryset(user=user, run_id=run_id, filters=filters)
    count = samples.count()
    page = min(page, max(1, math.ceil(count / per_page)))
    offset = (page - 1) * per_page
    return SamplePage(list(samples[offset : offset + per_page]), page, per_page, count)


def sample_steps(*, user: Any, run_id: int, split: str) -> list[int]:
    """Return the steps at which ``user``'s run recorded ``split`` samples, ascending."""
    if not visible_runs(user).filter(pk=run_id).exists():
        return []
    sample_table = connection.ops.quote_name(Sample._meta.db_table)
    # A loose index scan: each recursion finds the next step with one probe of sample_by_step.
    sql = f"""
        WITH RECURSIVE steps(step) AS (
            (SELECT s.step FROM {sample_table} s
              WHERE s.run_id = %s AND s.split = %s ORDER BY s.step LIMIT 1)
            UNION ALL
            SELECT (SELECT s.step FROM {sample_table} s
                     WHERE s.run_id = %s AND s.split = %s AND s.step > steps.step
                     ORDER BY s.step LIMIT 1)
              FROM steps WHERE steps.step IS NOT NULL
        )
        SELECT step FROM steps WHERE step IS NOT NULL
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id, split, run_id, split])
        return [row[0] for row in cursor.fetchall()]


@dataclass(frozen=True)
class StepSummary:
    """The rows of one step of one split, summarised above the table."""

    count: int
    reward_mean: float | None
    response_length_mean: float | None
    truncated: int


def sample_step_summary(*, user: Any, run_id: int, split: str, step: int) -> StepSummary:
    """Return the count, mean reward, mean length and truncated count of one step."""
    row = (
        owned_samples(user=user)
        .filter(run_id=run_id, split=split, step=step)
        .aggregate(
            count=Count("id"),
            reward_mean=Avg("reward", filter=~Q(reward=float("nan"))),
            length_mean=Avg("response_length"),
            truncated=Count("id", filter=Q(truncated=True)),
        )
    )
    return StepSummary(row["count"], row["reward_mean"], row["length_mean"], row["truncated"])


# -- group view ---------------------------------------------------------------------------------


class GroupMember(NamedTuple):
    sample: Sample
    normalized: float | None  # (reward - group mean) / (group std + epsilon), GRPO's advantage


@dataclass(frozen=True)
class SampleGroup:
    """The responses to one prompt at one step (GRPO's group), with the group's statistics."""

    run_id: int
    split: str
    step: int
    prompt_index: int
    members: list[GroupMember]
    reward_mean: float | None
    reward_std: float | None

    @property
    def first(self) -> Sample:
        return self.members[0].sample


def sample_group(
    *, user: Any, run_id: int, split: str, step: int, prompt_index: int
) -> SampleGroup | None:
    """Return the group of ``prompt_index`` at ``step`` with token arrays, or None if empty."""
    samples = list(
        owned_samples(user=user)
        .filter(run_id=run_id, split=split, step=step, prompt_index=prompt_index)
        .order_by("sample_index", "id")
    )
    if not samples:
        return None
    mean, std = reward_stats(s.reward for s in samples)
    members = []
    for s in samples:
        reward = _finite(s.reward)
        normalized = None
        if reward is not None and mean is not None and std is not None:
            normalized = (reward - mean) / (std + GRPO_EPSILON)
        members.append(GroupMember(s, normalized))
    return SampleGroup(run_id, split, step, prompt_index, members, mean, std)


def sample_neighbour_prompts(
    *, user: Any, run_id: int, split: str, step: int, prompt_index: int
) -> tuple[int | None, int | None]:
    """Return the prompt indices sampled at ``step`` just before and after ``prompt_index``."""
    rows = owned_samples(user=user).filter(run_id=run_id, split=split, step=step)
    before = rows.filter(prompt_index__lt=prompt_index).order_by("-prompt_index")
    after = rows.filter(prompt_index__gt=prompt_index).order_by("prompt_index")
    return (
        before.values_list("prompt_index", flat=True).first(),
        after.values_list("prompt_index", flat=True).first(),
    )


def _finite_list(values: Sequence[float] | None) -> list[float | None] | None:
    return None if values is None else [_finite(float(v)) for v in values]


def with_byte_pieces(samples: Sequence[Sample]) -> Sequence[Sample]:
    """Give each sample whose text holds U+FFFD its ``pieces`` (``tokens.response_pieces``): the
    text with each byte that is not UTF-8 kept as that byte. One query for their tokens."""
    broken = [s for s in samples if "\ufffd" in (s.response_text or "")]
    if broken:
        tokens = dict(
            Sample.objects.filter(pk__in=[s.pk for s in broken]).values_list("pk", "tokens")
        )
        for s in broken:
            s.pieces = response_pieces(tokens.get(s.pk) or [], s.response_text)  # type: ignore[attr-defined]
    return samples


def token_rows(samples: Iterable[Sample]) -> list[dict[str, Any]]:
    """Return each sample's tokens and per-token values for the token view (JSON-safe).

    ``kl`` is log-prob minus reference log-prob per token (None without a reference policy).
    ``text`` is each token's text as decoded from its bytes (``tokens.decode_tokens``: a
    character split across tokens shows whole on the token that completes it, ``partial``
    marks the tokens before), ``hex`` its bytes; all three None when the tokens are not
    byte-level.
    """
    rows = []
    for s in samples:
        decoded = decode_tokens(list(s.tokens), s.response_text)
        logprobs = _finite_list(s.token_logprobs) or []
        ref = _finite_list(s.token_ref_logprobs)
        kl = None
        if ref is not None:
            kl = [
                None if a is None or b is None else a - b
                for a, b in zip(logprobs, ref, strict=False)
            ]
        rows.append(
            {
                "id": s.pk,
                "sample_index": s.sample_index,
                "tokens": list(s.tokens),
                "text": None if decoded is None else [t.text for t in decoded],
                "hex": None if decoded is None else [t.hex for t in decoded],
                "partial": None if decoded is None else [t.partial for t in decoded],
                "bad": None if decoded is None else [t.bad for t in decoded],
                "logprob": logprobs,
                "kl": kl,
                "advantage": _finite_list(s.token_advantages),
            }
        )
    return rows


# -- across steps -------------------------------------------------------------------------------


class TrendPoint(NamedTuple):
    step: int
    reward_mean: float | None
    count: int


@dataclass(frozen=True)
class StepGroup:
    step: int
    samples: list[Sample]
    reward_mean: float | None


@dataclass(frozen=True)
class PromptHistory:
    """One prompt followed through training: its reward trend and a page of its groups."""

    split: str
    prompt_index: int
    prompt_text: str
    ground_truth: str | None
    trend: list[TrendPoint]
    groups: list[StepGroup]
    number: int
    num_pages: int


def sample_prompt_history(
    *,
    user: Any,
    run_id: int,
    split: str,
    prompt_index: int,
    page: int = 1,
    steps_per_page: int = 8,
) -> PromptHistory | None:
    """Return ``prompt_index``'s reward per step and its responses for one page of steps."""
    rows = owned_samples(user=user).filter(run_id=run_id, split=split, prompt_index=prompt_index)
    trend = [
        TrendPoint(r["step"], r["reward_mean"], r["count"])
        for r in rows.values("step")
        .annotate(reward_mean=Avg("reward", filter=~Q(reward=float("nan"))), count=Count("id"))
        .order_by("step")
    ]
    if not trend:
        return None
    num_pages = max(1, math.ceil(len(trend) / steps_per_page))
    page = min(max(page, 1), num_pages)
    shown = [p.step for p in trend[(page - 1) * steps_per_page : page * steps_per_page]]
    by_step: dict[int, list[Sample]] = {step: [] for step in shown}
    for s in rows.filter(step__in=shown).defer(*TOKEN_FIELDS).order_by("step", "sample_index"):
        by_step[s.step].append(s)
    groups = [
        StepGroup(step, samples, reward_stats(s.reward for s in samples)[0])
        for step, samples in by_step.items()
    ]
    first = groups[0].samples[0]
    return PromptHistory(
        split, prompt_index, first.prompt_text, first.ground_truth, trend, groups, page, num_pages
    )


@dataclass(frozen=True)
class RecurringPrompt:
    """A prompt sampled at several steps: its mean reward the first and the last time."""

    prompt_index: int
    prompt_text: str
    ground_truth: str | None
    steps: int
    first_step: int
    last_step: int
    first_mean: float | None
    last_mean: float | None

    @property
    def change(self) -> float | None:
        if self.first_mean is None or self.last_mean is None:
            return None
        return self.last_mean - self.first_mean


RECURRING_ORDERS = {
    "-change": "improved most",
    "change": "worsened most",
    "-steps": "sampled most often",
    "last": "lowest mean reward now",
}
_RECURRING_SQL = {
    "-change": "change DESC NULLS LAST",
    "change": "change ASC NULLS LAST",
    "-steps": "steps DESC",
    "last": "last_mean ASC NULLS LAST",
}


@dataclass(frozen=True)
class RecurringPage:
    prompts: list[RecurringPrompt]
    number: int
    num_pages: int
    count: int


def sample_recurring_prompts(
    *,
    user: Any,
    run_id: int,
    split: str,
    order: str = "-change",
    page: int = 1,
    per_page: int = 50,
) -> RecurringPage:
    """Return the run's prompts of ``split`` sampled at two steps or more (a training prompt
    comes back each epoch), ordered by how their mean reward changed, one page of them."""
    if order not in RECURRING_ORDERS:
        raise ValueError(f"order={order!r} is unknown; use one of {sorted(RECURRING_ORDERS)}")
    if not owned_samples(user=user).filter(run_id=run_id).exists():
        return RecurringPage([], 1, 1, 0)
    table = connection.ops.quote_name(Sample._meta.db_table)
    # Per prompt and step, the mean finite reward; then per prompt the first and last of them.
    base = f"""
        WITH per_step AS (
            SELECT prompt_index, step,
                   avg(reward) FILTER (WHERE reward <> 'NaN'::float8) AS mean
            FROM {table} WHERE run_id = %s AND split = %s
            GROUP BY prompt_index, step
        ), ranked AS (
            SELECT prompt_index, step, mean,
                   row_number() OVER (PARTITION BY prompt_index ORDER BY step) AS from_first,
                   row_number() OVER (PARTITION BY prompt_index ORDER BY step DESC) AS from_last,
                   count(*) OVER (PARTITION BY prompt_index) AS steps
            FROM per_step
        ), prompts AS (
            SELECT prompt_index, max(steps) AS steps,
                   min(step) AS first_step, max(step) AS last_step,
                   max(mean) FILTER (WHERE from_first = 1) AS first_mean,
                   max(mean) FILTER (WHERE from_last = 1) AS last_mean
            FROM ranked GROUP BY prompt_index HAVING max(steps) >= 2
        )
    """  # noqa: S608 - the table name is the model's, the values are parameters
    with connection.cursor() as cursor:
        cursor.execute(f"{base} SELECT count(*) FROM prompts", [run_id, split])
        count = cursor.fetchone()[0]
        num_pages = max(1, math.ceil(count / per_page))
        page = min(max(page, 1), num_pages)
        cursor.execute(
            f"""{base}
            SELECT prompt_index, steps, first_step, last_step, first_mean, last_mean,
                   last_mean - first_mean AS change
            FROM prompts ORDER BY {_RECURRING_SQL[order]}, prompt_index
            LIMIT %s OFFSET %s""",
            [run_id, split, per_page, (page - 1) * per_page],
        )
        rows = cursor.fetchall()
    texts = {
        index: (text, truth)
        for index, text, truth in owned_samples(user=user)
        .filter(run_id=run_id, split=split, prompt_index__in=[r[0] for r in rows])
        .order_by("prompt_index", "-step")
        .distinct("prompt_index")
        .values_list("prompt_index", "prompt_text", "ground_truth")
    }
    prompts = [
        RecurringPrompt(
            index, *texts.get(index, ("", None)), steps, first, last, _finite(a), _finite(b)
        )
        for index, steps, first, last, a, b, _ in rows
    ]
    return RecurringPage(prompts, page, num_pages, count)


# -- across runs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResponses:
    """One run's group for the compared prompt, at the latest step not after the one asked."""

    run: Run
    step: int | None
    samples: list[Sample] = field(default_factory=list)
    reward_mean: float | None = None
    reward_std: float | None = None
    delta: float | None = None  # reward_mean minus the reference run's
    is_reference: bool = False


@dataclass(frozen=True)
class PromptAcrossRuns:
    split: str
    prompt_text: str
    ground_truth: str | None
    runs: list[RunResponses]  # the reference first

    @property
    def reference(self) -> RunResponses:
        return self.runs[0]


def _latest_group(
    samples: QuerySet[Sample], prompt_text: str, prompt_index: int, step: int | None
) -> list[Sample]:
    candidates = samples.filter(prompt_text=prompt_text)
    if step is not None:
        candidates = candidates.filter(step__lte=step)
    # Same dataset: the prompt sits at the same index (sample_by_prompt); else search by text.
    found = candidates.filter(prompt_index=prompt_index).order_by("-step").values("step").first()
    index = prompt_index
    if found is None:
        found = candidates.order_by("-step").values("step", "prompt_index").first()
        if found is None:
            return []
        index = found["prompt_index"]
    group = samples.filter(step=found["step"], prompt_index=index, prompt_text=prompt_text)
    return list(group.defer(*TOKEN_FIELDS).order_by("sample_index", "id"))


def sample_across_runs(
    *,
    user: Any,
    reference_run_id: int,
    run_ids: Sequence[int],
    split: str,
    prompt_index: int,
    step: int | None = None,
) -> PromptAcrossRuns | None:
    """Return the prompt at ``prompt_index`` of the reference run as answered by each run.

    Each run shows its group at the latest step not after ``step`` (the latest step when None);
    ``delta`` is its mean reward minus the reference's. Runs ``user`` may not read are left out.
    """
    runs = visible_runs(user).filter(pk__in=[reference_run_id, *run_ids])
    owned = {r.pk: r for r in runs}
    if reference_run_id not in owned:
        return None
    ordered = [reference_run_id] + [
        pk for pk in dict.fromkeys(run_ids) if pk in owned and pk != reference_run_id
    ]
    anchor = owned_samples(user=user).filter(
        run_id=reference_run_id, split=split, prompt_index=prompt_index
    )
    if step is not None:
        anchor = anchor.filter(step__lte=step)
    first = anchor.order_by("-step").only("prompt_text", "ground_truth").first()
    if first is None:
        return None
    results: list[RunResponses] = []
    reference_mean: float | None = None
    for pk in ordered:
        samples = _latest_group(
            owned_samples(user=user).filter(run_id=pk, split=split),
            first.prompt_text,
            prompt_index,
            step,
        )
        mean, std = reward_stats(s.reward for s in samples)
        if pk == reference_run_id:
            reference_mean = mean
        delta = None if mean is None or reference_mean is None else mean - reference_mean
        results.append(
            RunResponses(
                owned[pk],
                samples[0].step if samples else None,
                samples,
                mean,
                std,
                delta,
                pk == reference_run_id,
            )
        )
    return PromptAcrossRuns(split, first.prompt_text, first.ground_truth, results)


# -- exports ------------------------------------------------------------------------------------

EXPORT_FIELDS = ("run_id", *SAMPLE_SCALAR_FIELDS)


def sample_export_rows(
    *, user: Any, run_id: int, filters: SampleFilter, with_tokens: bool
) -> QuerySet:
    """Return the filtered samples as value tuples (``EXPORT_FIELDS``, then the token arrays)."""
    fields = EXPORT_FIELDS + (TOKEN_FIELDS if with_tokens else ())
    return sample_filter_queryset(user=user, run_id=run_id, filters=filters).values_list(*fields)
