"""``Studio`` and the objects it returns: experiments, runs and datasets of the token's owner."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

TERMINAL_STATUSES = ("succeeded", "failed", "cancelled", "lost")


class StudioError(Exception):
    """The server refused a request: ``status``, ``errors`` (each ``{"key", "message"}``).

    ``retry_after`` is the seconds the server asked to wait (a 429 past the API's rate limit),
    or None.
    """

    def __init__(
        self, status: int, errors: list[dict[str, Any]], retry_after: int | None = None
    ) -> None:
        self.status = status
        self.errors = errors
        self.retry_after = retry_after
        lines = [f"{e['key']}: {e['message']}" if e.get("key") else e["message"] for e in errors]
        super().__init__(f"HTTP {status}: " + "; ".join(lines))

    @property
    def field_errors(self) -> dict[str | None, str]:
        """Return the messages by key (None for the request as a whole)."""
        return {e.get("key"): e["message"] for e in self.errors}


class Studio:
    """A connection to a studio as the owner of ``token`` (made at /accounts/tokens/)."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, **httpx_options: Any):
        self.http = httpx.Client(
            base_url=url.rstrip("/") + "/api",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            **httpx_options,
        )
        self.experiments = Experiments(self)
        self.runs = Runs(self)
        self.datasets = Datasets(self)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send a request; raise ``StudioError`` with the server's errors for a 4xx or 5xx."""
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                errors = response.json()["errors"]
            except (ValueError, KeyError, TypeError):
                errors = [{"key": None, "message": response.text[:500] or response.reason_phrase}]
            wait = response.headers.get("Retry-After", "")
            raise StudioError(response.status_code, errors, int(wait) if wait.isdigit() else None)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        return response.json() if response.content else None

    def items(self, path: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Return every item of a paginated list."""
        items: list[dict[str, Any]] = []
        while True:
            page = self.json("GET", path, params={**(params or {}), "offset": len(items)})
            items += page["items"]
            if not page["items"] or len(items) >= page["count"]:
                return items

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Studio:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Resource:
    """An object of the API: its JSON in ``data``, its fields as attributes."""

    path = ""

    def __init__(self, studio: Studio, data: dict[str, Any]) -> None:
        self.studio = studio
        self.data = data

    @property
    def id(self) -> int:
        return self.data["id"]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["data"][name]
        except KeyError:
            raise AttributeError(name) from None

    def refresh(self) -> _Resource:
        """Read the object again from the server."""
        self.data = self.studio.json("GET", f"{self.path}/{self.id}")
        return self

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.id}: {self.data.get('name') or self.data.get('status')}>"
        )


class Experiment(_Resource):
    path = "/experiments"

    def launch(self, launch_key: str = "") -> Run:
        """Queue a run of this experiment (the same ``launch_key`` again returns that run)."""
        body = {"launch_key": launch_key} if launch_key else {}
        return Run(
            self.studio, self.studio.json("POST", f"{self.path}/{self.id}/launch", json=body)
        )

    def clone(self, name: str | None = None) -> Experiment:
        data = self.studio.json("POST", f"{self.path}/{self.id}/clone", json={"name": name})
        return Experiment(self.studio, data)

    def archive(self, archived: bool = True) -> Experiment:
        body = {"archived": archived}
        self.data = self.studio.json("POST", f"{self.path}/{self.id}/archive", json=body)
        return self

    def delete(self) -> None:
        self.studio.request("DELETE", f"{self.path}/{self.id}")

    def runs(self) -> list[Run]:
        return self.studio.runs.list(experiment=self.id)


class Run(_Resource):
    path = "/runs"

    @property
    def status(self) -> str:
        return self.data["status"]

    def refresh(self) -> Run:
        self.data = self.studio.json("GET", f"{self.path}/{self.id}")
        return self

    def wait(self, timeout: float = 3600.0, poll: float = 2.0) -> Run:
        """Poll until the run ends; return it. ``TimeoutError`` if it is still going then."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.studio.json("GET", f"{self.path}/{self.id}/status")
            self.data.update(state)
            if state["status"] in TERMINAL_STATUSES:
                return self.refresh()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"run {self.id} is still {state['status']} after {timeout} s")
            time.sleep(poll)

    def cancel(self) -> Run:
        """Cancel: a queued run ends now, a running one after its current step."""
        self.data = self.studio.json("POST", f"{self.path}/{self.id}/cancel")
        return self

    def resume(self, launch_key: str = "") -> Run:
        """Queue a run that continues this one from its last checkpoint."""
        body = {"launch_key": launch_key} if launch_key else {}
        return Run(
            self.studio, self.studio.json("POST", f"{self.path}/{self.id}/resume", json=body)
        )

    def metrics(self) -> Any:
        """Return every recorded step as a pandas DataFrame: index ``step``, ``time``, metrics."""
        import pandas as pd

        table = self.studio.json("GET", f"{self.path}/{self.id}/metrics/all")
        frame = pd.DataFrame({"time": table["time"], **table["values"]}, index=table["step"])
        frame.index.name = "step"
        return frame

    def metric_series(self, *names: str, points: int = 1500, **steps: int) -> dict[str, Any]:
        """Return the series downsampled as the charts draw them (``from``/``to`` in ``steps``)."""
        params: dict[str, Any] = {"name": list(names), "points": points, **steps}
        return self.studio.json("GET", f"{self.path}/{self.id}/metrics", params=params)["series"]

    def samples(self, step: int | None = None, **filters: Any) -> list[dict[str, Any]]:
        """Return one step's samples (the latest without ``step``), every page of them.

        ``filters`` are the inspector's: split, reward_min, reward_max, q, truncated, sort. A
        multi-turn sample's ``turns`` lists each turn after the prompt (docs/api.md).
        """
        params = {**filters, "per_page": 200}
        if step is not None:
            params["step"] = step
        samples: list[dict[str, Any]] = []
        page = 1
        while True:
            body = self.studio.json(
                "GET", f"{self.path}/{self.id}/samples", params={**params, "page": page}
            )
            samples += body["samples"]
            if body["page"] >= body["num_pages"]:
                return samples
            page += 1

    def group(self, prompt: int, step: int | None = None, split: str = "train") -> dict[str, Any]:
        """Return the responses to one prompt at one step, with their tokens."""
        params = {"prompt": prompt, "split": split, **({"step": step} if step is not None else {})}
        return self.studio.json("GET", f"{self.path}/{self.id}/samples/group", params=params)


class Dataset(_Resource):
    path = "/datasets"

    def preview(self) -> dict[str, Any]:
        return self.studio.json("GET", f"{self.path}/{self.id}/preview")

    def delete(self) -> None:
        self.studio.request("DELETE", f"{self.path}/{self.id}")


class Experiments:
    def __init__(self, studio: Studio) -> None:
        self.studio = studio

    def create(
        self,
        config: dict[str, Any] | str | Path,
        name: str | None = None,
        *,
        description: str = "",
        tags: list[str] | str = (),  # type: ignore[assignment]
    ) -> Experiment:
        """Create an experiment from a config: a dict (JSON), YAML text or a YAML file's path.

        ``name`` defaults to the config's ``trainer.experiment_name``.
        """
        body: dict[str, Any] = {
            "description": description,
            "tags": list(tags) if not isinstance(tags, str) else tags,
        }
        if isinstance(config, Path) or (
            isinstance(config, str) and config.endswith((".yaml", ".yml")) and "\n" not in config
        ):
            config = Path(config).read_text()
        if isinstance(config, str):
            body["config_yaml"] = config
        else:
            body["config"] = config
        if name is None:
            trainer = config.get("trainer", {}) if isinstance(config, dict) else {}
            name = trainer.get("experiment_name") or "experiment"
        body["name"] = name
        return Experiment(self.studio, self.studio.json("POST", "/experiments", json=body))

    def get(self, experiment_id: int) -> Experiment:
        return Experiment(self.studio, self.studio.json("GET", f"/experiments/{experiment_id}"))

    def list(self, **filters: Any) -> list[Experiment]:
        """Return your experiments (filters: q, tag, status, archived)."""
        return [Experiment(self.studio, d) for d in self.studio.items("/experiments", filters)]


class Runs:
    def __init__(self, studio: Studio) -> None:
        self.studio = studio

    def get(self, run_id: int) -> Run:
        return Run(self.studio, self.studio.json("GET", f"/runs/{run_id}"))

    def list(self, **filters: Any) -> list[Run]:
        """Return your runs, newest first (filters: status, experiment)."""
        return [Run(self.studio, d) for d in self.studio.items("/runs", filters)]


class Datasets:
    def __init__(self, studio: Studio) -> None:
        self.studio = studio

    def upload(self, path: str | Path, name: str = "", **key_map: str) -> Dataset:
        """Upload a parquet, JSONL or CSV file; ``key_map``: ``prompt="question"``, ..."""
        path = Path(path)
        fields = {"name": name, **{f"map_{target}": column for target, column in key_map.items()}}
        with path.open("rb") as handle:
            data = self.studio.json(
                "POST", "/datasets", data=fields, files={"file": (path.name, handle)}
            )
        return Dataset(self.studio, data)

    def get(self, dataset_id: int) -> Dataset:
        return Dataset(self.studio, self.studio.json("GET", f"/datasets/{dataset_id}"))

    def list(self) -> list[Dataset]:
        return [Dataset(self.studio, d) for d in self.studio.items("/datasets")]
