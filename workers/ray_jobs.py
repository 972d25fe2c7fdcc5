"""Ray's job server, as the sweep asks it how a run's driver job is doing or tells it to stop one.

Runs whose driver is a Ray Job (``RAY_ADDRESS`` names the head's dashboard) are submitted with
Ray's ``JobSubmissionClient`` (``workers.tasks.submit_ray_job``). The sweep, every 15 s in a
worker, reads the same jobs through Ray's jobs REST API (``/api/jobs/<id>``, its ``/logs`` and
``/stop``), which that client wraps with no timeout: here each request has ``TIMEOUT_S``, and a
server that did not answer is not asked again by the same :class:`RayJobServer` (one a sweep),
so a head that is down costs a sweep one timeout, not one a run.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from webapp.runs.driver_writes import error_tail

logger = logging.getLogger(__name__)

ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
TIMEOUT_S = 5.0


class RayJobServer:
    """The job server at ``address`` (a dashboard's ``http(s)://`` address; any other names none)."""

    def __init__(self, address: str) -> None:
        address = address.rstrip("/")
        self.address = address if address.startswith(("http://", "https://")) else None
        self.silent = False  # it did not answer once: not asked again

    def job_end(self, job_id: str) -> str | None:
        """Return how the job ``job_id`` ended, once the server says it did.

        The text is Ray's status and the first line of its message, then the end of the job's
        log (a driver that failed before it started, at import say, wrote nothing to the run's
        own log). None while the job is pending or running, and None where the server does not
        answer or does not know the job: the heartbeat decides then.
        """
        path = f"/api/jobs/{quote(job_id, safe='')}"
        try:
            info = self._request("GET", path)
            if info is None or info.get("status") not in ENDED:
                return None
            log = str((self._request("GET", f"{path}/logs") or {}).get("logs") or "")
        except ValueError as error:  # a body that is not a JSON object
            logger.info("Ray's job server said nothing of job %s: %s", job_id, error)
            return None
        # Ray's message: "Job entrypoint command failed with exit code 1, last available logs
        # ...": its first line up to the logs, which follow here on their own.
        message = str(info.get("message") or "").strip().split("\n")[0]
        message = message.split(", last available logs")[0].rstrip(":")
        ended = f"Ray says {info['status']}" + (f" ({message})" if message else "")
        if log.strip():
            where = f"ray job logs {job_id}"
            ended += f"\n\nthe end of its log ({where}):\n" + error_tail(log, whole_in=where)
        return ended

    def stop(self, job_id: str) -> bool:
        """Ask the server to stop the job (Ray sends ``SIGTERM``, then ``SIGKILL``); return
        whether it took the request."""
        try:
            return self._request("POST", f"/api/jobs/{quote(job_id, safe='')}/stop") is not None
        except ValueError:
            return True  # it answered, with a body this client does not read

    def _request(self, method: str, path: str) -> dict[str, Any] | None:
        """Return the server's JSON object for ``method path``; None where there is no server,
        it did not answer (then not asked again) or it refused (404: no such job)."""
        if self.address is None or self.silent:
            return None
        request = urllib.request.Request(
            self.address + path, method=method, headers=_auth_headers()
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                body = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            logger.info("Ray's job server refused %s %s: %s", method, path, error)
            return None
        except OSError as error:  # refused, unreachable, timed out
            logger.warning("Ray's job server at %s did not answer: %s", self.address, error)
            self.silent = True
            return None
        if not isinstance(body, dict):
            raise ValueError(f"{method} {path} answered {type(body).__name__}, not an object")
        return body


def _auth_headers() -> dict[str, str]:
    """Return the token header Ray's job client sends where the cluster has token auth on."""
    try:
        from ray._private.authentication.http_token_authentication import (
            get_auth_headers_if_auth_enabled,
        )
    except ImportError:  # another Ray: a cluster with auth on answers 401, the heartbeat decides
        logger.warning("this Ray has no get_auth_headers_if_auth_enabled; asking with no token")
        return {}
    return dict(get_auth_headers_if_auth_enabled({}))
