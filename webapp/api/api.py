"""The studio's REST API: one ``NinjaAPI``, one router per resource, one error shape.

Each resource module (``experiments``, ``runs``, ``samples``, ``datasets``, ``sweeps``) holds a
``router`` that validates input, checks ownership through the selectors and calls the same
services as the HTML views; a new resource is a new module and one ``add_router`` line here.
The OpenAPI 3 schema is generated from the code at ``/api/openapi.json``; the docs page is
``/api/docs``. Every operation counts against ``POSTTRAIN_API_RATE`` (``webapp.api.throttle``).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from django.http.request import RawPostDataException
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError

from engine.config import ConfigError
from webapp.api import datasets, experiments, external, runs, samples, sweeps
from webapp.api.auth import API_AUTH
from webapp.api.errors import ApiError, config_error, validation_errors
from webapp.api.throttle import ApiRateThrottle
from webapp.datasets.services import DatasetRejected
from webapp.experiments.services import ExperimentBusy
from webapp.runs.quotas import LaunchRefused
from webapp.runs.services import RunStateError

api = NinjaAPI(
    title="PostTrain Studio API",
    version="1",
    description=(
        "Experiments, runs, metrics, samples and datasets of the logged-in user. "
        "Authenticate with `Authorization: Bearer <token>` (make one at /accounts/tokens/) "
        "or a browser session (unsafe methods then need the `X-CSRFToken` header). "
        'Every error is `{"errors": [{"key": ..., "message": ...}]}`. '
        "Each token (and each browser session) may send POSTTRAIN_API_RATE requests per window "
        "(600 a minute unless the server sets another rate); past it the answer is 429 with "
        "`Retry-After`."
    ),
    auth=API_AUTH,
    throttle=[ApiRateThrottle()],
    urls_namespace="api",
)
api.add_router("/experiments", experiments.router)
api.add_router("/runs", runs.router)
api.add_router("/runs", samples.router)
api.add_router("/datasets", datasets.router)
api.add_router("/sweeps", sweeps.router)
api.add_router("/external-runs", external.router)


def _errors(request: HttpRequest, status: int, errors: list[dict]) -> HttpResponse:
    return api.create_response(request, {"errors": errors}, status=status)


def _one(request: HttpRequest, status: int, message: str, key: str | None = None) -> HttpResponse:
    return _errors(request, status, [{"key": key, "message": message}])


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    return _errors(request, exc.status, exc.errors)


@api.exception_handler(ConfigError)
def _config_error(request: HttpRequest, exc: ConfigError) -> HttpResponse:
    error = config_error(exc)
    return _errors(request, error.status, error.errors)


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = [{"key": k, "message": m} for k, m in validation_errors(exc.errors)]
    return _errors(request, 422, errors)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = _one(
        request,
        401,
        "authenticate with 'Authorization: Bearer <token>' (make a token at /accounts/tokens/) "
        "or log in; a revoked token no longer works",
    )
    response["WWW-Authenticate"] = "Bearer"
    return response


@api.exception_handler(Throttled)
def _throttled(request: HttpRequest, exc: Throttled) -> HttpResponse:
    refusal = request.api_rate_refusal  # type: ignore[attr-defined]
    response = _one(request, 429, refusal.message)
    response["Retry-After"] = str(refusal.retry_after)
    return response


@api.exception_handler(PermissionDenied)
def _forbidden(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
    """The object is visible to the user, whose project role does not allow the action."""
    return _one(request, 403, str(exc) or "your role on this object does not allow this")


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return _one(request, 404, str(exc) or "not found")


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return _one(request, exc.status_code, str(exc))


@api.exception_handler(LaunchRefused)
def _launch_refused(request: HttpRequest, exc: LaunchRefused) -> HttpResponse:
    return _one(request, 429, str(exc))


@api.exception_handler(RunStateError)
@api.exception_handler(ExperimentBusy)
def _conflict(request: HttpRequest, exc: Exception) -> HttpResponse:
    return _one(request, 409, str(exc))


@api.exception_handler(DatasetRejected)
def _dataset_rejected(request: HttpRequest, exc: DatasetRejected) -> HttpResponse:
    return _one(request, 400, str(exc), key="file")


@api.exception_handler(RequestDataTooBig)
def _body_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return _one(
        request,
        413,
        f"the request body is over {limit // 1024**2} MiB (DATA_UPLOAD_MAX_MEMORY_SIZE); send "
        "less per request (posttrain_client splits its batches)",
    )


@api.exception_handler(RawPostDataException)
def _form_body(request: HttpRequest, exc: RawPostDataException) -> HttpResponse:
    # A form-encoded body on a JSON endpoint: the session's CSRF check has read it as a form.
    return _one(request, 400, "send the body as JSON, with 'Content-Type: application/json'")
