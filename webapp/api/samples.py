"""``/api/runs/{run_id}/samples``: the steps with samples, one step's samples (filtered, sorted,
paged), one prompt's group, and the exports. The query is checked by the inspector's own forms
(``webapp.samples.forms``), so a bad value gets the inspector's message under its name.

A multi-turn sample carries its ``turns`` as the inspector shows them: the ``Sample.turns`` JSON
the run's recorder wrote (``engine.rollout.multi_turn``), read as is, so the page, the API and
the exports give the same turns."""

import math
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from pydantic import ConfigDict

from webapp.api.errors import ErrorOut, field_error, form_error
from webapp.api.runs import owned_run
from webapp.runs.models import SampleSplit
from webapp.samples.export import sample_export_response
from webapp.samples.forms import PromptForm, SampleFilterForm
from webapp.samples.selectors import (
    SORTS,
    sample_group,
    sample_page,
    sample_steps,
    token_rows,
)

router = Router(tags=["samples"])
ERRORS: dict[int | tuple[int, ...], Any] = {(400, 403, 404, 422): ErrorOut}


def _value(obj: Any, name: str) -> Any:
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class ToolCallOut(Schema):
    name: str = Field(description="The tool called; '' when the call could not be parsed.")
    arguments: dict[str, Any]


class TurnOut(Schema):
    """One turn after the prompt: an assistant's text and its tool calls, a tool's answer, or an
    interaction's message (any further keys of that message are kept)."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(description="assistant, tool, or the interaction's role (user).")
    content: Any = Field(None, description="The turn's text (an interaction may send parts).")
    tool_calls: list[ToolCallOut] | None = Field(
        None, description="Assistant turns: the calls the tool turns after it answer, in order."
    )
    name: str | None = Field(None, description="Tool turns: the tool that answered.")
    arguments: dict[str, Any] | None = Field(None, description="Tool turns: the call's arguments.")
    error: str | None = Field(
        None, description="Tool turns: why the call failed; user turns: the interaction's error."
    )
    seconds: float | None = Field(None, description="Tool turns: how long the call ran.")
    score: float | None = Field(None, description="Interaction turns: the turn's score.")
    ends: bool | None = Field(None, description="Interaction turns: the conversation ended here.")


class SampleOut(Schema):
    id: int
    step: int
    split: SampleSplit
    prompt_index: int
    sample_index: int
    group_id: str
    data_source: str
    prompt_text: str
    response_text: str
    ground_truth: str | None
    reward: float | None = Field(description="null where the reward was not a finite number.")
    reward_parts: dict[str, Any]
    reward_error: str | None
    advantage: float | None
    response_length: int
    truncated: bool
    turns: list[TurnOut] | None = Field(
        description="Multi-turn rollouts: each turn after the prompt; null for a single turn."
    )

    @staticmethod
    def resolve_reward(obj: Any) -> float | None:
        return _finite(_value(obj, "reward"))

    @staticmethod
    def resolve_advantage(obj: Any) -> float | None:
        return _finite(_value(obj, "advantage"))


class SamplePageOut(Schema):
    step: int | None = Field(description="The step shown (the latest when none was asked).")
    count: int
    page: int
    per_page: int
    num_pages: int
    samples: list[SampleOut]


class TokenRow(Schema):
    tokens: list[str]
    logprob: list[float | None]
    kl: list[float | None] | None
    advantage: list[float | None] | None


class GroupMemberOut(SampleOut):
    normalized: float | None = Field(description="(reward - mean) / (std + 1e-6), GRPO's.")
    token_view: TokenRow


class GroupOut(Schema):
    step: int
    split: SampleSplit
    prompt_index: int
    reward_mean: float | None
    reward_std: float | None
    members: list[GroupMemberOut]


class SampleQuery(Schema):
    """The inspector's step-view filters (``SampleFilterForm`` checks them)."""

    split: SampleSplit | None = None
    step: int | None = Field(None, description="Default: the latest step with samples.")
    reward_min: float | None = None
    reward_max: float | None = None
    q: str | None = Field(None, description="Text in the prompt or the response.")
    truncated: bool | None = Field(None, description="Truncated responses only.")
    sort: Literal[tuple(SORTS)] | None = None  # type: ignore[valid-type]
    page: int | None = None
    per_page: int | None = None


class ExportQuery(SampleQuery):
    format: Literal["jsonl", "csv"] = "jsonl"
    tokens: bool = Field(True, description="JSONL only: include the per-token arrays.")


def _checked(form_class: type, request: HttpRequest) -> Any:
    form = form_class(request.GET)
    if not form.is_valid():
        raise form_error(form)
    return form


@router.get("/{int:run_id}/samples/steps", response={200: dict[SampleSplit, list[int]], **ERRORS})
def sample_step_list(request: HttpRequest, run_id: int) -> Any:
    """Return the steps at which the run recorded samples, per split."""
    run = owned_run(request, run_id)
    return {
        split: sample_steps(user=request.user, run_id=run.pk, split=split)
        for split in SampleSplit.values
    }


@router.get("/{int:run_id}/samples", response={200: SamplePageOut, **ERRORS})
def sample_list(request: HttpRequest, run_id: int, query: Query[SampleQuery]) -> Any:
    """Return one page of one step's samples, filtered and sorted as in the inspector."""
    run = owned_run(request, run_id)
    form = _checked(SampleFilterForm, request)
    data = form.cleaned_data
    step = data.get("step")
    if step is None:
        steps = sample_steps(user=request.user, run_id=run.pk, split=form.filters(None).split)
        step = steps[-1] if steps else None
    if step is None:
        return {"step": None, "count": 0, "page": 1, "per_page": 50, "num_pages": 1, "samples": []}
    page = sample_page(
        user=request.user,
        run_id=run.pk,
        filters=form.filters(step),
        page=data.get("page") or 1,
        per_page=data.get("per_page") or 50,
    )
    return {
        "step": step,
        "count": page.count,
        "page": page.number,
        "per_page": page.per_page,
        "num_pages": page.num_pages,
        "samples": page.samples,
    }


@router.get("/{int:run_id}/samples/group", response={200: GroupOut, **ERRORS})
def sample_group_read(
    request: HttpRequest,
    run_id: int,
    prompt: int | None = Query(None, description="The prompt index (required)."),
    step: int | None = Query(None, description="Default: the latest step with samples."),
    split: SampleSplit | None = None,
) -> Any:
    """Return the responses to one prompt at one step (GRPO's group), with their tokens."""
    run = owned_run(request, run_id)
    form = _checked(PromptForm, request)
    split_value, prompt, step = (
        form.split_value,
        form.cleaned_data["prompt"],
        form.cleaned_data.get("step"),
    )
    if step is None:
        steps = sample_steps(user=request.user, run_id=run.pk, split=split_value)
        step = steps[-1] if steps else None
    group = None
    if step is not None:
        group = sample_group(
            user=request.user, run_id=run.pk, split=split_value, step=step, prompt_index=prompt
        )
    if group is None:
        raise field_error(
            "prompt", f"the run has no {split_value} samples of prompt {prompt} at step {step}", 404
        )
    tokens = token_rows(m.sample for m in group.members)
    members = [
        {**SampleOut.from_orm(m.sample).dict(), "normalized": m.normalized, "token_view": row}
        for m, row in zip(group.members, tokens, strict=True)
    ]
    return {
        "step": group.step,
        "split": group.split,
        "prompt_index": group.prompt_index,
        "reward_mean": group.reward_mean,
        "reward_std": group.reward_std,
        "members": members,
    }


@router.get("/{int:run_id}/samples/export", response={200: None, **ERRORS})
def sample_export(request: HttpRequest, run_id: int, query: Query[ExportQuery]) -> Any:
    """Download the filtered samples (one step, or every step without ``step``) as JSONL or CSV."""
    run = owned_run(request, run_id)
    form = _checked(SampleFilterForm, request)
    filters = form.filters(form.cleaned_data.get("step"))
    return sample_export_response(
        request, run=run, filters=filters, fmt=query.format, tokens=query.tokens
    )
