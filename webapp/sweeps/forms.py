"""The builder's sweep section: the keys to sweep (YAML), the mode, count, seed and concurrency,
and for a search or early stopping the objective and the pruner with its settings.

The params text is ``{dotted.key: [values]}`` for a grid, and for a random or tpe sweep each key's
list (a choice) or range (``{log_uniform: [1e-6, 1e-4]}``; see ``webapp.sweeps.spec``). The
builder's "sweep" buttons add a key with its current value. ``spec`` is what ``sweep_create``
takes; the settings' bounds are the spec's to check (one message for the form and the API), so
the fields here take any whole number.
"""

from __future__ import annotations

from typing import Any

from django import forms

from engine.config import ConfigError, ConfigValidationError
from engine.config.yaml_io import YamlLimitError, yaml_load
from webapp.sweeps.spec import PRUNERS

PRUNER_SETTINGS = tuple(dict.fromkeys(name for s in PRUNERS.values() for name in s))
FIELD_OF_KEY = {
    "mode": "mode",
    "count": "count",
    "seed": "seed",
    "concurrency": "concurrency",
    "n_startup_trials": "startup_trials",
    "objective": "metric",
    "objective.metric": "metric",
    "objective.direction": "direction",
    "pruner": "pruner",
    "pruner.type": "pruner",
    **{f"pruner.{name}": f"pruner_{name}" for name in PRUNER_SETTINGS},
}


class SweepForm(forms.Form):
    """The sweep half of the builder's POST (prefix ``sweep``); ``spec`` once it is valid."""

    mode = forms.ChoiceField(
        choices=[
            ("grid", "grid (every combination)"),
            ("random", "random (count draws)"),
            ("tpe", "Bayesian (TPE: each draw learns from the scores)"),
        ],
        initial="grid",
    )
    params = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "class": "yaml"}),
        label="Keys to sweep (YAML)",
        help_text="grid: key: [v1, v2]. random: key: {log_uniform: [lo, hi]}, {uniform: [lo, hi]}, "
        "{int: [lo, hi]} or [choices]. The sweep buttons next to fields add their key.",
    )
    count = forms.IntegerField(required=False, min_value=1, help_text="random: how many members.")
    seed = forms.IntegerField(
        required=False, min_value=0, help_text="random: the same seed, the same members."
    )
    concurrency = forms.IntegerField(
        min_value=1, initial=2, help_text="Members running at once; the rest wait queued."
    )
    startup_trials = forms.IntegerField(
        required=False, help_text="tpe: members drawn at random before TPE models the scores (10)."
    )
    metric = forms.CharField(
        required=False,
        max_length=200,
        label="Objective metric",
        help_text="tpe and pruners: the metric that scores a member, e.g. "
        "val-core/<data source>/reward/mean@1 (validation) or critic/score/mean.",
    )
    direction = forms.ChoiceField(
        required=False,
        choices=[("maximize", "maximize"), ("minimize", "minimize")],
        initial="maximize",
    )
    pruner = forms.ChoiceField(
        required=False,
        choices=[
            ("", "none (every member runs to its end)"),
            ("median", "median (stop a member below the finished members' median)"),
            ("successive_halving", "successive halving (keep the best 1/factor at each rung)"),
        ],
        help_text="Stops members whose objective falls behind at a validation step.",
    )
    pruner_n_startup_trials = forms.IntegerField(
        required=False, label="median: finished members first", help_text="Default 5."
    )
    pruner_n_warmup_steps = forms.IntegerField(
        required=False, label="median: warm-up steps", help_text="Never stop before it (0)."
    )
    pruner_interval_steps = forms.IntegerField(
        required=False, label="median: judge every N steps", help_text="Default 1."
    )
    pruner_min_resource = forms.IntegerField(
        required=False, label="halving: first rung's step", help_text="Default 1."
    )
    pruner_reduction_factor = forms.IntegerField(
        required=False, label="halving: reduction factor", help_text="Keep 1/factor (3)."
    )
    pruner_min_early_stopping_rate = forms.IntegerField(
        required=False, label="halving: early-stopping rate", help_text="Default 0."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "sweep")
        super().__init__(*args, **kwargs)
        self.spec: dict[str, Any] | None = None

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        try:
            params = yaml_load(cleaned["params"], "the keys to sweep")
        except (YamlLimitError, ConfigError) as exc:
            self.add_error("params", str(exc))
            return cleaned
        if not isinstance(params, dict):
            self.add_error("params", "write one 'dotted.key: [values]' line per key to sweep")
            return cleaned
        self.spec = {"mode": cleaned["mode"], "params": params}
        if cleaned["mode"] in ("random", "tpe"):
            self.spec.update(count=cleaned.get("count"), seed=cleaned.get("seed"))
        else:
            for field in ("count", "seed"):
                if cleaned.get(field) is not None:
                    self.add_error(field, f"a grid has no {field}; leave it empty or pick random")
        if cleaned.get("startup_trials") is not None:
            self.spec["n_startup_trials"] = cleaned["startup_trials"]
        if cleaned.get("metric"):
            self.spec["objective"] = {
                "metric": cleaned["metric"],
                "direction": cleaned.get("direction") or "maximize",
            }
        self._pruner(cleaned)
        return cleaned

    def _pruner(self, cleaned: dict[str, Any]) -> None:
        kind = cleaned.get("pruner")
        given = {n: cleaned.get(f"pruner_{n}") for n in PRUNER_SETTINGS}
        given = {n: v for n, v in given.items() if v is not None}
        if not kind:
            for name in given:
                self.add_error(f"pruner_{name}", "choose a pruner, or leave its settings empty")
            return
        assert self.spec is not None
        for name in set(given) - set(PRUNERS[kind]):
            self.add_error(
                f"pruner_{name}", f"the {kind} pruner has no such setting; leave it empty"
            )
        self.spec["pruner"] = {
            "type": kind,
            **{n: v for n, v in given.items() if n in PRUNERS[kind]},
        }

    def add_sweep_errors(self, error: ConfigValidationError) -> None:
        """Show each problem of the spec or a member under the field it concerns."""
        for item in error.errors:
            field = FIELD_OF_KEY.get(item.key, "params")
            shown = (
                f"{item.key}: {item.message}" if field == "params" and item.key else item.message
            )
            self.add_error(field, shown)
