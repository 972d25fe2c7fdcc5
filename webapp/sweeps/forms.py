"""The builder's sweep section: the keys to sweep (YAML), the mode, count, seed and concurrency.

The params text is ``{dotted.key: [values]}`` for a grid, and for a random sweep each key's list
(a choice) or range (``{log_uniform: [1e-6, 1e-4]}``; see ``webapp.sweeps.spec``). The builder's
"sweep" buttons add a key with its current value. ``spec`` is what ``sweep_create`` takes.
"""

from __future__ import annotations

from typing import Any

from django import forms

from engine.config import ConfigError, ConfigValidationError
from engine.config.yaml_io import YamlLimitError, yaml_load

FIELD_OF_KEY = {"mode": "mode", "count": "count", "seed": "seed", "concurrency": "concurrency"}


class SweepForm(forms.Form):
    """The sweep half of the builder's POST (prefix ``sweep``); ``spec`` once it is valid."""

    mode = forms.ChoiceField(
        choices=[("grid", "grid (every combination)"), ("random", "random (count draws)")],
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
        if cleaned["mode"] == "random":
            self.spec.update(count=cleaned.get("count"), seed=cleaned.get("seed"))
        else:
            for field in ("count", "seed"):
                if cleaned.get(field) is not None:
                    self.add_error(field, f"a grid has no {field}; leave it empty or pick random")
        return cleaned

    def add_sweep_errors(self, error: ConfigValidationError) -> None:
        """Show each problem of the spec or a member under the field it concerns."""
        for item in error.errors:
            field = FIELD_OF_KEY.get(item.key, "params")
            shown = (
                f"{item.key}: {item.message}" if field == "params" and item.key else item.message
            )
            self.add_error(field, shown)
