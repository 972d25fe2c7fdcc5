"""Experiment pages: list, builder (new, import, clone), detail and actions. Owner only.

Views parse and authorise; ``services`` decide. Another user's experiment is a 404 everywhere.
"""

from __future__ import annotations

from typing import Any

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from engine.config import (
    ConfigError,
    ConfigValidationError,
    PPOConfig,
    config_to_dict,
    config_to_yaml,
)
from engine.config.tree import put
from engine.rewards.names import DATA_SOURCE_SCORERS
from webapp.experiments.configs import (
    DEFAULT_PRESET,
    as_config,
    config_import,
    list_presets,
    missing_files,
    model_roots_text,
    preset_load,
)
from webapp.experiments.forms import ExperimentForm, YamlImportForm, field_name
from webapp.experiments.models import Experiment
from webapp.experiments.rewards import reward_modules_dir
from webapp.experiments.selectors import experiment_list_for_user, experiment_tags_for_user
from webapp.experiments.services import (
    ExperimentBusy,
    experiment_create,
    experiment_delete,
    experiment_set_archived,
)
from webapp.projects.access import EDIT, OWN, VIEW, experiment_for, experiment_may
from webapp.projects.selectors import project_move_targets
from webapp.runs.launching import flash_already_launched, flash_launched, launch_response
from webapp.runs.models import RunStatus
from webapp.runs.quotas import LaunchRefused
from webapp.runs.selectors import run_list_for_user
from webapp.runs.services import AlreadyLaunched, RunStateError, refuse_external, run_create
from webapp.sweeps.forms import SweepForm


def _experiment(request: HttpRequest, experiment_id: int, need: str = VIEW) -> Experiment:
    """The experiment if the user holds ``need`` on it: 404 without a view right, else 403."""
    listed = experiment_list_for_user(user=request.user, archived=None)
    return experiment_for(request.user, experiment_id, need, queryset=listed)


def yaml_response(config: PPOConfig | dict, filename: str) -> HttpResponse:
    """Return the config as a downloadable YAML file."""
    response = HttpResponse(config_to_yaml(as_config(config)), content_type="application/yaml")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@login_required
def experiment_list(request: HttpRequest) -> HttpResponse:
    archived = request.GET.get("archived") == "1"
    filters = {
        "search": request.GET.get("q", ""),
        "tag": request.GET.get("tag", ""),
        "status": request.GET.get("status", ""),
    }
    experiments = experiment_list_for_user(user=request.user, archived=archived, **filters)
    context = {
        "experiments": experiments,
        "filters": filters,
        "archived": archived,
        "statuses": RunStatus.choices,
        "tags": experiment_tags_for_user(user=request.user),
    }
    return render(request, "experiments/list.html", context)


def render_builder(
    request: HttpRequest,
    form: ExperimentForm,
    *,
    import_form: YamlImportForm | None = None,
    source: str = "",
    status: int = 200,
    extra: dict[str, Any] | None = None,
) -> HttpResponse:
    """Render the builder page around ``form`` (``extra``: more context, e.g. its sweep form)."""
    context = {
        "form": form,
        "import_form": import_form or YamlImportForm(),
        "presets": list_presets(),
        "preset": form["preset"].value() or "",
        "source": source,
        "reward_modules_dir": reward_modules_dir(),
        "basic_groups": form.field_groups(advanced=False),
        "advanced_groups": form.field_groups(advanced=True),
        "reward_rows": form.reward_rows(),
        "scored_sources": list(DATA_SOURCE_SCORERS),
        **(extra or {}),
    }
    return render(request, "experiments/builder.html", context, status=status)


def builder_for_config(
    request: HttpRequest, config: PPOConfig, *, name: str = "", preset: str = "", source: str = ""
) -> HttpResponse:
    """Render the builder prefilled with ``config``."""
    initial = ExperimentForm.initial_from_config(config, request.user)
    initial.update({"name": name, "preset": preset, "launch": True})
    missing = [(key, value, field_name(key)) for key, value in missing_files(config)]
    extra = {"missing_files": missing, "model_roots_text": model_roots_text()}
    return render_builder(
        request, ExperimentForm(owner=request.user, initial=initial), source=source, extra=extra
    )


@login_required
def experiment_new(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        preset = request.GET.get("preset") or DEFAULT_PRESET
        try:
            config = preset_load(preset)
        except ConfigError as exc:
            if preset != DEFAULT_PRESET:
                raise Http404(str(exc)) from None
            config, preset = PPOConfig(), ""
        return builder_for_config(request, config, preset=preset, source=f"preset {preset}")
    form = ExperimentForm(request.POST, owner=request.user)
    extra: dict[str, Any] = {}
    if request.POST.get("sweep-params", "").strip():  # the builder's sweep section is filled in
        form.add_error(None, "keys are marked to sweep: press Create sweep, or clear them")
        extra["sweep_form"] = SweepForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            with transaction.atomic():
                experiment = experiment_create(
                    owner=request.user,
                    name=data["name"],
                    config=form.config,
                    description=data["description"],
                    tags=data["tags"],
                    preset=data["preset"],
                )
                run = (
                    run_create(experiment=experiment, launch_key=request.POST.get("launch_key", ""))
                    if data["launch"]
                    else None
                )
        except ConfigValidationError as exc:
            form.add_config_errors(exc)
        except LaunchRefused as exc:
            form.add_error(None, str(exc))
        except AlreadyLaunched as exc:  # the experiment this POST made is rolled back
            return flash_already_launched(request, exc)
        else:
            if run is None:
                return redirect(experiment)
            flash_launched(request, run, f"Run #{run.pk} queued.")
            return redirect(run)
    return render_builder(request, form, status=400, extra=extra)


@login_required
@require_POST
def builder_preview(request: HttpRequest) -> JsonResponse:
    """Return the YAML the builder's current values make, with the validator's errors by field."""
    form = ExperimentForm(request.POST, owner=request.user)
    form.is_valid()
    errors = {
        name: [str(message) for message in field_errors]
        for name, field_errors in form.errors.items()
        if name != "name"
    }
    whole = changes = ""
    if form.config is not None:
        tree = preview_tree(form)
        whole = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)
        base, base_name = preview_base(str(request.POST.get("preset") or ""))
        diff = config_changes(tree, config_to_dict(base))
        changes = (
            f"# what differs from {base_name}\n"
            + yaml.safe_dump(diff, sort_keys=False, allow_unicode=True)
            if diff
            else f"# the same as {base_name}\n"
        )
    status = 400 if form.refused else 200  # a field's YAML was refused: nothing was checked
    body = {"yaml": whole, "changes": changes, "errors": errors, "warnings": form.warnings}
    return JsonResponse(body, status=status)


def preview_tree(form: ExperimentForm) -> dict[str, Any]:
    """Return the form's config as a tree, with each value the form could not read shown as
    typed and why, not as the default the config kept in its place."""
    assert form.config is not None
    tree = config_to_dict(form.config)
    for key, (text, why) in form.unset.items():
        put(tree, key.split("."), f"{text} ← invalid, not used: {why}")
    return tree


def preview_base(preset: str) -> tuple[PPOConfig, str]:
    """Return the config the preview's changes are measured from, and how to name it."""
    if preset:
        try:
            return preset_load(preset), f"preset {preset}"
        except ConfigError:
            pass
    return PPOConfig(), "verl's defaults"


def config_changes(now: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Return the leaves of ``now`` that differ from ``base``, nested as in ``now``."""
    out: dict[str, Any] = {}
    for key, value in now.items():
        old = base.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            if sub := config_changes(value, old):
                out[key] = sub
        elif key not in base or value != old:
            out[key] = value
    return out


@login_required
@require_POST
def experiment_import(request: HttpRequest) -> HttpResponse:
    """Open imported YAML or key=value lines in the builder; when the text is refused, keep what
    the builder held (its fields come with the import) and list every problem of the text."""
    import_form = YamlImportForm(request.POST, request.FILES)
    preset = request.POST.get("preset", "")
    if import_form.is_valid():
        try:
            config, built_on = config_import(import_form.cleaned_data["text"], base=preset)
        except ConfigValidationError as exc:
            for error in exc.errors:
                import_form.add_error(None, str(error))
        except ConfigError as exc:
            import_form.add_error(None, str(exc))
        else:
            name = (
                config.trainer.experiment_name
                if config.trainer.experiment_name != "default"
                else ""
            )
            return builder_for_config(
                request, config, name=name, preset=built_on, source="imported text"
            )
    form = ExperimentForm(owner=request.user)
    form.initial = ExperimentForm.initial_from_post(form, request.POST)
    if not form.initial:  # the import came without the builder's fields (an old page)
        form.initial = ExperimentForm.initial_from_config(PPOConfig(), request.user)
    form.initial.setdefault("launch", True)
    return render_builder(request, form, import_form=import_form, status=400)


@login_required
def experiment_clone(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    try:
        refuse_external(experiment=experiment, action="clone")
    except RunStateError as exc:
        messages.error(request, str(exc))
        return redirect(experiment)
    return builder_for_config(
        request,
        as_config(experiment.config),
        name=f"{experiment.name} (copy)",
        preset=experiment.preset,
        source=f"experiment {experiment.name}",
    )


@login_required
def experiment_detail(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    runs = run_list_for_user(user=request.user, experiment_id=experiment.pk)
    context = {
        "experiment": experiment,
        "runs": runs,
        "may_edit": experiment_may(request.user, experiment, EDIT),
        "may_own": experiment_may(request.user, experiment, OWN),
        "move_targets": project_move_targets(user=request.user),
    }
    return render(request, "experiments/detail.html", context)


@login_required
def experiment_yaml(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    return yaml_response(experiment.config, f"experiment-{experiment.pk}.yaml")


@login_required
@require_POST
def experiment_launch(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id, EDIT)
    return launch_response(
        request,
        lambda key: run_create(experiment=experiment, launch_key=key, launcher=request.user),
        refused_to=experiment,
        queued=lambda run: f"Run #{run.pk} queued.",
    )


@login_required
@require_POST
def experiment_archive(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id, OWN)
    experiment_set_archived(experiment=experiment, archived=not experiment.archived)
    messages.success(
        request, f"{experiment.name} {'archived' if experiment.archived else 'restored'}."
    )
    return redirect(experiment)


@login_required
def experiment_remove(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id, OWN)
    if request.method == "POST":
        try:
            experiment_delete(experiment=experiment)
        except ExperimentBusy as exc:
            messages.error(request, str(exc))
            return redirect(experiment)
        messages.success(request, f"Experiment {experiment.name} deleted.")
        return redirect("experiments:list")
    context: dict[str, Any] = {"experiment": experiment, "run_count": experiment.runs.count()}
    return render(request, "experiments/confirm_delete.html", context)
