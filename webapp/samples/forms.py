"""Query-string forms of the inspector: they parse and check what a URL asks for.

Every view reads its parameters from GET so that a view is a link one can share or reload;
a bad value answers 400 with the form's message, which names the parameter and its fix.
"""

from __future__ import annotations

from typing import Any

from django import forms

from webapp.runs.models import SampleSplit
from webapp.samples.selectors import RECURRING_ORDERS, SORTS, SampleFilter

PER_PAGE_CHOICES = (25, 50, 100, 200)
COLOUR_CHOICES = (
    ("logprob", "log-prob"),
    ("kl", "log-prob − reference log-prob"),
    ("advantage", "advantage"),
)


class SampleFilterForm(forms.Form):
    """The step view's and the exports' filters: split, step, reward range, text, sort, page."""

    split = forms.ChoiceField(choices=SampleSplit.choices, required=False)
    step = forms.IntegerField(min_value=0, required=False)
    reward_min = forms.FloatField(required=False, label="reward ≥")
    reward_max = forms.FloatField(required=False, label="reward ≤")
    q = forms.CharField(required=False, max_length=200, label="text")
    truncated = forms.BooleanField(required=False, label="truncated only")
    sort = forms.ChoiceField(choices=list(SORTS.items()), required=False)
    page = forms.IntegerField(min_value=1, required=False)
    per_page = forms.TypedChoiceField(
        choices=[(n, n) for n in PER_PAGE_CHOICES], coerce=int, required=False, empty_value=50
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        low, high = data.get("reward_min"), data.get("reward_max")
        if low is not None and high is not None and low > high:
            raise forms.ValidationError(
                f"reward ≥ {low} is above reward ≤ {high}: swap the two bounds or clear one."
            )
        return data

    def filters(self, step: int | None) -> SampleFilter:
        """Return the validated filters for ``step`` (None: every step)."""
        data = self.cleaned_data
        return SampleFilter(
            split=data.get("split") or SampleSplit.TRAIN,
            step=step,
            reward_min=data.get("reward_min"),
            reward_max=data.get("reward_max"),
            text=(data.get("q") or "").strip(),
            truncated_only=bool(data.get("truncated")),
            sort=data.get("sort") or "position",
        )


class RecurringForm(forms.Form):
    """The recurring prompts page: which split, in which order, which page."""

    split = forms.ChoiceField(choices=SampleSplit.choices, required=False)
    order = forms.ChoiceField(choices=list(RECURRING_ORDERS.items()), required=False)
    page = forms.IntegerField(min_value=1, required=False)


class PromptForm(forms.Form):
    """Which prompt a group, across-steps or across-runs view shows."""

    split = forms.ChoiceField(choices=SampleSplit.choices, required=False)
    prompt = forms.IntegerField(
        min_value=0, error_messages={"required": "Name a prompt: add prompt=<prompt index>."}
    )
    step = forms.IntegerField(min_value=0, required=False)
    sample = forms.IntegerField(min_value=0, required=False)
    page = forms.IntegerField(min_value=1, required=False)
    colour = forms.ChoiceField(choices=COLOUR_CHOICES, required=False)

    @property
    def split_value(self) -> str:
        return self.cleaned_data.get("split") or SampleSplit.TRAIN


class CompareForm(PromptForm):
    """The across-runs view: the runs to show and the reference the deltas are taken against."""

    runs = forms.TypedMultipleChoiceField(coerce=int, required=False)
    reference = forms.TypedChoiceField(coerce=int, required=False, empty_value=None)

    def __init__(self, *args: Any, run_choices: list[tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["runs"].choices = run_choices
        self.fields["reference"].choices = run_choices
        self.fields["runs"].error_messages["invalid_choice"] = (
            "Run %(value)s is not one of your runs: pick runs from the list."
        )
        self.fields["reference"].error_messages["invalid_choice"] = (
            "Run %(value)s is not one of your runs: pick the reference from the list."
        )
