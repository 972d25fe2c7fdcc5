"""The run page's forms: evaluating a checkpoint (``webapp.runs.checkpoints``)."""

from __future__ import annotations

from typing import Any

from django import forms

from webapp.runs.checkpoints import N_MAX, eval_data_choices


class CheckpointEvaluateForm(forms.Form):
    """What to score a checkpoint on, and how (``engine.eval``'s options)."""

    data = forms.ChoiceField(label="data")
    n = forms.IntegerField(
        label="samples a prompt",
        min_value=1,
        max_value=N_MAX,
        initial=1,
        help_text="1: greedy accuracy only; more adds mean@n and best@n",
    )
    max_samples = forms.IntegerField(
        label="prompts", min_value=1, required=False, help_text="empty: every prompt"
    )
    temperature = forms.FloatField(label="temperature", min_value=0.0, initial=1.0)

    def __init__(self, *args: Any, run: Any, user: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", False)  # one form a checkpoint row: no repeated ids
        super().__init__(*args, **kwargs)
        self.fields["data"].choices = eval_data_choices(run=run, user=user)
