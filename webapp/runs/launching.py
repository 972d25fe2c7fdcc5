"""What every launch button does: queue the run, then flash what happened and go to it.

A launch (the experiment's Launch, the builder's Create and launch, a run's Resume) either
queues a run, finds the one an earlier POST of the same form made (its ``launch_key``), or is
refused with a reason the member can act on; the run page's "queued" note is tagged so it
comes down once the run moves on.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from engine.config import ConfigValidationError
from webapp.runs.models import Run, RunStatus
from webapp.runs.quotas import LaunchRefused
from webapp.runs.services import AlreadyLaunched, RunStateError


def flash_launched(request: HttpRequest, run: Run, text: str) -> None:
    """Flash ``text`` if the broker took the run's start, otherwise why the run did not start.

    The ``launched-run-<id>`` tag lets the run page take the "queued" note down once the run
    moves on (``run_summary.js``): a note that stayed up said "queued" after the run had ended.
    """
    run.refresh_from_db(fields=["status", "error"])
    if run.status == RunStatus.FAILED:
        reason = run.error.partition("\n")[0]
        messages.error(request, f"Run #{run.pk} did not start: {reason}")
    else:
        messages.success(request, text, extra_tags=f"launched launched-run-{run.pk}")


def flash_already_launched(request: HttpRequest, exc: AlreadyLaunched) -> HttpResponse:
    """Send a repeated POST of a launch form to the run the first one made."""
    messages.info(request, f"Run #{exc.run.pk} was already launched from this page.")
    return redirect(exc.run)


def launch_response(
    request: HttpRequest,
    launch: Callable[[str], Run],
    *,
    refused_to: Model,
    queued: Callable[[Run], str],
) -> HttpResponse:
    """Queue a run with ``launch(launch_key)`` and answer as every launch button does.

    The new run's page with ``queued(run)`` flashed; a repeated POST goes to the run the first
    one made; a refusal (an invalid config, a quota, a run that cannot be resumed) is flashed on
    ``refused_to``'s page.
    """
    try:
        run = launch(request.POST.get("launch_key", ""))
    except AlreadyLaunched as exc:
        return flash_already_launched(request, exc)
    except (ConfigValidationError, LaunchRefused, RunStateError) as exc:
        messages.error(request, str(exc))
        return redirect(refused_to)
    flash_launched(request, run, queued(run))
    return redirect(run)
