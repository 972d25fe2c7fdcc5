"""Dataset pages: list, upload with preview, key mapping, download, delete. Owner only."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from engine.rewards.names import DATA_SOURCE_SCORERS
from webapp.datasets.forms import DatasetUploadForm, KeyMapForm
from webapp.datasets.selectors import dataset_all_for_user
from webapp.datasets.services import (
    DatasetRejected,
    dataset_create,
    dataset_delete,
    dataset_set_key_map,
)
from webapp.datasets.uploads import upload_refusals


def _dataset(request: HttpRequest, dataset_id: int):
    return get_object_or_404(dataset_all_for_user(user=request.user), pk=dataset_id)


@login_required
def dataset_list(request: HttpRequest) -> HttpResponse:
    datasets = dataset_all_for_user(user=request.user)
    return render(request, "datasets/list.html", {"datasets": datasets})


@login_required
def dataset_upload(request: HttpRequest) -> HttpResponse:
    form = DatasetUploadForm(
        request.POST or None,
        request.FILES or None,
        refused_file=upload_refusals(request).get("file", "") if request.method == "POST" else "",
    )
    if request.method == "POST" and form.is_valid():
        try:
            dataset = dataset_create(
                owner=request.user,
                name=form.cleaned_data["name"],
                upload=form.cleaned_data["file"],
                key_map=form.key_map(),
                data_source=form.cleaned_data["data_source"],
            )
        except DatasetRejected as exc:
            form.add_error("file", str(exc))
        else:
            return redirect(dataset)
    return render(request, "datasets/upload.html", {"form": form})


@login_required
def dataset_detail(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = _dataset(request, dataset_id)
    form = KeyMapForm(
        request.POST or None,
        initial=KeyMapForm.initial_from(dataset.key_map, dataset.data_source),
    )
    if request.method == "POST" and form.is_valid():
        try:
            dataset_set_key_map(
                dataset=dataset,
                key_map=form.key_map(),
                data_source=form.cleaned_data["data_source"],
            )
        except DatasetRejected as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, "Key map saved; the preview below uses it.")
            return redirect(dataset)
    columns = dataset.preview.get("columns") or []
    rows = [[row.get(c) for c in columns] for row in dataset.preview.get("rows") or []]
    found = dataset.preview.get("data_sources") or [
        row.get("data_source") for row in dataset.preview.get("mapped") or []
    ]
    sources = [(s, DATA_SOURCE_SCORERS.get(s)) for s in dict.fromkeys(found)]
    context = {"dataset": dataset, "form": form, "rows": rows, "sources": sources}
    return render(request, "datasets/detail.html", context)


@login_required
def dataset_download(request: HttpRequest, dataset_id: int) -> FileResponse:
    dataset = _dataset(request, dataset_id)
    filename = dataset.file.name.rsplit("/", 1)[-1]
    return FileResponse(dataset.file.open("rb"), as_attachment=True, filename=filename)


@login_required
@require_POST
def dataset_remove(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = _dataset(request, dataset_id)
    dataset_delete(dataset=dataset)
    messages.success(request, f"Dataset {dataset.name} deleted.")
    return redirect("datasets:list")
