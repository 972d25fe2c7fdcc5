"""Sample inspector pages: step view, group view (with the token view), across steps, across runs,
the step list a live page polls, and the exports. Owner only: another user's run is a 404.

Views parse the query string with ``webapp.samples.forms`` and read through
``webapp.samples.selectors``; the pages render on the server and ``frontend/js/inspector.js``
adds the step slider, token colouring, response diffs and the trend chart.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_safe

from webapp.projects.access import VIEW, run_for
from webapp.runs.models import Run, SampleSplit
from webapp.runs.selectors import run_list_for_user
from webapp.samples.export import sample_export_response
from webapp.samples.forms import (
    COLOUR_CHOICES,
    PER_PAGE_CHOICES,
    CompareForm,
    PromptForm,
    RecurringForm,
    SampleFilterForm,
)
from webapp.samples.selectors import (
    RECURRING_ORDERS,
    SORTS,
    sample_across_runs,
    sample_group,
    sample_neighbour_prompts,
    sample_page,
    sample_prompt_history,
    sample_recurring_prompts,
    sample_step_summary,
    sample_steps,
    token_rows,
    with_byte_pieces,
)


def _run(request: HttpRequest, run_id: int) -> Run:
    """The run, if the user may read it (``webapp.projects.access``); 404 otherwise."""
    return run_for(request.user, run_id, VIEW)


def _bad_request(request: HttpRequest, run: Run, form: Any) -> HttpResponse:
    errors = [
        f"{'' if name == '__all__' else name + ': '}{message}"
        for name, messages in form.errors.items()
        for message in messages
    ]
    context = {"run": run, "experiment": run.experiment, "errors": errors, "tab": ""}
    return render(request, "samples/bad_request.html", context, status=400)


def _tab(request: HttpRequest, run: Run, tab: str, **context: Any) -> HttpResponse:
    """Render the run's sample tab ``tab`` (its template's name): each knows its run, experiment,
    tab and the splits."""
    common = {"run": run, "experiment": run.experiment, "tab": tab, "splits": SampleSplit.choices}
    return render(request, f"samples/{tab}.html", {**common, **context})


def _nearest(steps: list[int], step: int | None) -> int | None:
    """Return ``step`` if it has samples, else the closest step that has (the latest if None)."""
    if not steps:
        return None
    if step is None:
        return steps[-1]
    return min(steps, key=lambda s: (abs(s - step), -s))


@login_required
@require_safe
def sample_step_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """Show one step's samples of one split: filter, sort, paginate."""
    run = _run(request, run_id)
    form = SampleFilterForm(request.GET)
    if not form.is_valid():
        return _bad_request(request, run, form)
    split = form.cleaned_data.get("split") or SampleSplit.TRAIN
    steps = sample_steps(user=request.user, run_id=run.pk, split=split)
    asked = form.cleaned_data.get("step")
    step = _nearest(steps, asked)
    context: dict[str, Any] = {
        "form": form,
        "split": split,
        "sorts": SORTS.items(),
        "steps": steps,
        "step": step,
        "asked_step": asked,
        "step_position": steps.index(step) if step is not None else 0,
        "per_page_choices": PER_PAGE_CHOICES,
        "urls": _row_urls(run),
        "page": None,
    }
    if step is not None:
        filters = form.filters(step)
        context["page"] = sample_page(
            user=request.user,
            run_id=run.pk,
            filters=filters,
            page=form.cleaned_data.get("page") or 1,
            per_page=form.cleaned_data.get("per_page") or 50,
        )
        with_byte_pieces(context["page"].samples)
        context["summary"] = sample_step_summary(
            user=request.user, run_id=run.pk, split=split, step=step
        )
    query = request.GET.copy()
    query.pop("page", None)
    context["query"] = query.urlencode()
    query.pop("step", None)
    context["export_query"] = query.urlencode()
    return _tab(request, run, "step", **context)


def _row_urls(run: Run) -> dict[str, str]:
    # Each row links to three views: reverse them once, not three times a row.
    return {
        name: reverse(f"samples:{name}", kwargs={"run_id": run.pk})
        for name in ("group", "prompt", "compare")
    }


@login_required
@require_safe
def sample_run_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """Show the responses of every step of one split, worst reward first unless sorted else."""
    run = _run(request, run_id)
    form = SampleFilterForm(request.GET)
    if not form.is_valid():
        return _bad_request(request, run, form)
    split = form.cleaned_data.get("split") or SampleSplit.TRAIN
    filters = form.filters(None)
    if not form.cleaned_data.get("sort"):
        filters = dataclasses.replace(filters, sort="reward")
    page = sample_page(
        user=request.user,
        run_id=run.pk,
        filters=filters,
        page=form.cleaned_data.get("page") or 1,
        per_page=form.cleaned_data.get("per_page") or 50,
    )
    with_byte_pieces(page.samples)
    query = request.GET.copy()
    query.pop("page", None)
    return _tab(
        request,
        run,
        "run",
        form=form,
        split=split,
        sorts=SORTS.items(),
        sort=filters.sort,
        per_page_choices=PER_PAGE_CHOICES,
        urls=_row_urls(run),
        page=page,
        query=query.urlencode(),
    )


@login_required
@require_safe
def sample_recurring_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """List the prompts sampled at several steps (each epoch), by how their reward changed."""
    run = _run(request, run_id)
    form = RecurringForm(request.GET)
    if not form.is_valid():
        return _bad_request(request, run, form)
    split = form.cleaned_data.get("split") or SampleSplit.TRAIN
    order = form.cleaned_data.get("order") or "-change"
    recurring = sample_recurring_prompts(
        user=request.user,
        run_id=run.pk,
        split=split,
        order=order,
        page=form.cleaned_data.get("page") or 1,
    )
    return _tab(
        request,
        run,
        "prompts",
        split=split,
        order=order,
        orders=RECURRING_ORDERS.items(),
        recurring=recurring,
        prompt_url=reverse("samples:prompt", kwargs={"run_id": run.pk}),
    )


@login_required
@require_safe
def sample_steps_json(request: HttpRequest, run_id: int) -> JsonResponse:
    """Return the steps with samples per split and the run's status (polled by live pages)."""
    run = _run(request, run_id)
    steps = {
        split: sample_steps(user=request.user, run_id=run.pk, split=split)
        for split in SampleSplit.values
    }
    return JsonResponse({"status": run.status, "active": run.is_active, "steps": steps})


@login_required
@require_safe
def sample_group_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """Show the responses to one prompt at one step side by side, and their tokens."""
    run = _run(request, run_id)
    form = PromptForm(request.GET)
    if not form.is_valid():
        return _bad_request(request, run, form)
    split = form.split_value
    prompt = form.cleaned_data["prompt"]
    step = form.cleaned_data.get("step")
    if step is None:
        step = _nearest(sample_steps(user=request.user, run_id=run.pk, split=split), None)
    group = None
    neighbours: tuple[int | None, int | None] = (None, None)
    if step is not None:
        group = sample_group(
            user=request.user, run_id=run.pk, split=split, step=step, prompt_index=prompt
        )
        neighbours = sample_neighbour_prompts(
            user=request.user, run_id=run.pk, split=split, step=step, prompt_index=prompt
        )
    return _tab(
        request,
        run,
        "group",
        split=split,
        step=step,
        prompt=prompt,
        group=group,
        previous_prompt=neighbours[0],
        next_prompt=neighbours[1],
        selected=form.cleaned_data.get("sample"),
        colour=form.cleaned_data.get("colour") or "logprob",
        colours=COLOUR_CHOICES,
        tokens=token_rows(m.sample for m in group.members) if group else [],
    )


@login_required
@require_safe
def sample_prompt_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """Follow one prompt through training: its responses at each step and its reward trend."""
    run = _run(request, run_id)
    form = PromptForm(request.GET)
    if not form.is_valid():
        return _bad_request(request, run, form)
    split = form.split_value
    prompt = form.cleaned_data["prompt"]
    history = sample_prompt_history(
        user=request.user,
        run_id=run.pk,
        split=split,
        prompt_index=prompt,
        page=form.cleaned_data.get("page") or 1,
    )
    trend = (
        [{"step": p.step, "reward": p.reward_mean, "n": p.count} for p in history.trend]
        if (history)
        else []
    )
    if history:
        with_byte_pieces([s for group in history.groups for s in group.samples])
    return _tab(
        request,
        run,
        "prompt",
        split=split,
        prompt=prompt,
        step=form.cleaned_data.get("step"),
        history=history,
        trend=trend,
    )


@login_required
@require_safe
def sample_compare_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """Show one prompt as several runs answer it, with reward deltas against a reference run."""
    run = _run(request, run_id)
    runs = list(run_list_for_user(user=request.user))
    choices = [(r.pk, f"{r.experiment.name} · run #{r.pk}") for r in runs]
    form = CompareForm(request.GET, run_choices=choices)
    if not form.is_valid():
        return _bad_request(request, run, form)
    split = form.split_value
    prompt = form.cleaned_data["prompt"]
    step = form.cleaned_data.get("step")
    reference = form.cleaned_data.get("reference") or run.pk
    chosen = form.cleaned_data.get("runs") or []
    comparison = sample_across_runs(
        user=request.user,
        reference_run_id=reference,
        run_ids=[run.pk, *chosen],
        split=split,
        prompt_index=prompt,
        step=step,
    )
    return _tab(
        request,
        run,
        "compare",
        split=split,
        prompt=prompt,
        step=step,
        comparison=comparison,
        all_runs=runs,
        chosen={run.pk, reference, *chosen},
        reference=reference,
    )


def _export(request: HttpRequest, run_id: int, fmt: str) -> HttpResponse:
    run = _run(request, run_id)
    form = SampleFilterForm(request.GET)
    if not form.is_valid():
        return _bad_request(request, run, form)
    filters = form.filters(form.cleaned_data.get("step"))
    tokens = request.GET.get("tokens", "1") != "0"
    return sample_export_response(request, run=run, filters=filters, fmt=fmt, tokens=tokens)


@login_required
@require_safe
def sample_export_jsonl(request: HttpRequest, run_id: int) -> HttpResponse:
    """Stream the filtered samples (one step, or every step without ``step``) as JSON lines."""
    return _export(request, run_id, "jsonl")


@login_required
@require_safe
def sample_export_csv(request: HttpRequest, run_id: int) -> HttpResponse:
    """Stream the filtered samples (one step, or every step without ``step``) as CSV."""
    return _export(request, run_id, "csv")
