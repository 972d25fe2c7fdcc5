"""``/api/datasets``: upload (multipart, checked by the upload page's form and service), list,
read with the preview, delete."""

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from ninja import Field, Form, Router, Schema, Status
from ninja.pagination import paginate
from pydantic import create_model

from engine.data.rows import MAP_TARGETS
from engine.rewards.names import DATA_SOURCE_SCORERS
from webapp.api.errors import ErrorOut, form_error
from webapp.api.pagination import Pages
from webapp.datasets.forms import KEY_MAP_HELP, DatasetUploadForm
from webapp.datasets.models import Dataset, DatasetFormat, DatasetStatus
from webapp.datasets.selectors import dataset_all_for_user
from webapp.datasets.services import dataset_create, dataset_delete
from webapp.datasets.uploads import upload_refusals

SOURCES = list(DATA_SOURCE_SCORERS)
router = Router(tags=["datasets"])
ERRORS: dict[int | tuple[int, ...], Any] = {(400, 404, 422): ErrorOut}


class DatasetOut(Schema):
    id: int
    name: str
    format: DatasetFormat
    status: DatasetStatus = Field(description="Only a ready dataset feeds a run.")
    row_count: int | None
    key_map: dict[str, str] = Field(description="data.data_key_map: engine field <- column.")
    data_source: str = Field(
        description="data_source of rows without that column (a scorer); empty: the file name."
    )
    path: str = Field(description="What data.train_files or data.val_files names.")
    created_at: datetime


class PreviewOut(Schema):
    columns: list[str] = []
    rows: list[dict[str, Any]] = []
    mapped: list[dict[str, Any]] = Field([], description="The first rows as the engine reads them.")
    errors: list[str] = []


class DatasetDetail(DatasetOut):
    preview: PreviewOut


# The upload page's fields: a name and, per engine field the key map feeds, the file's column.
UploadIn = create_model(
    "UploadIn",
    __base__=Schema,
    name=(str, Field("", max_length=200, description="Default: the file name.")),
    data_source=(
        str,
        Field("", max_length=200, description="A scorer's data_source: " + ", ".join(SOURCES)),
    ),
    **{
        f"map_{target}": (str, Field("", max_length=200, description=KEY_MAP_HELP.get(target)))
        for target in MAP_TARGETS
    },
)


def owned_dataset(request: HttpRequest, dataset_id: int) -> Dataset:
    """Return the user's dataset; another's is a 404."""
    return get_object_or_404(dataset_all_for_user(user=request.user), pk=dataset_id)


@router.get("", response=list[DatasetOut])
@paginate(Pages)
def list_datasets(request: HttpRequest) -> Any:
    """List your datasets, newest first (those needing a fix included)."""
    return dataset_all_for_user(user=request.user)


@router.post("", response={201: DatasetDetail, **ERRORS})
def upload_dataset(
    request: HttpRequest,
    fields: Form[UploadIn],  # type: ignore[valid-type], file: File[UploadedFile] = None
) -> Any:
    """Upload a parquet, JSONL or CSV file; it is previewed and checked as on the upload page."""
    refused = upload_refusals(request).get("file", "")
    form = DatasetUploadForm(request.POST, request.FILES, refused_file=refused)
    if not form.is_valid():
        raise form_error(form)
    dataset = dataset_create(
        owner=request.user,
        name=form.cleaned_data["name"],
        upload=form.cleaned_data["file"],
        key_map=form.key_map(),
        data_source=form.cleaned_data["data_source"],
    )
    return Status(201, dataset)


@router.get("/{int:dataset_id}", response={200: DatasetDetail, **ERRORS})
def read_dataset(request: HttpRequest, dataset_id: int) -> Any:
    """Read one dataset with its preview (the first rows, as the engine maps them)."""
    return owned_dataset(request, dataset_id)


@router.get("/{int:dataset_id}/preview", response={200: PreviewOut, **ERRORS})
def preview_dataset(request: HttpRequest, dataset_id: int) -> Any:
    """Return the dataset's preview: columns, first rows and the errors its check found."""
    return owned_dataset(request, dataset_id).preview


@router.delete("/{int:dataset_id}", response={204: None, **ERRORS})
def delete_dataset(request: HttpRequest, dataset_id: int) -> Any:
    """Delete the dataset and its file (runs that used it keep their samples)."""
    dataset_delete(dataset=owned_dataset(request, dataset_id))
    return Status(204, None)
