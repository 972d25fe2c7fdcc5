"""Forms for uploading a dataset and mapping its columns to the engine's fields."""

from __future__ import annotations

from django import forms
from django.conf import settings

from engine.data.rows import MAP_TARGETS
from engine.rewards.names import DATA_SOURCE_SCORERS
from webapp.datasets.uploads import size_text

KEY_MAP_HELP = {
    "prompt": "Column with the prompt (text or chat messages). Empty: 'prompt'.",
    "ground_truth": "Column with the reference answer. Empty: reward_model.ground_truth.",
    "data_source": "Column naming each row's task (selects its reward). Empty: the choice above.",
    "ability": "Column with the task category (optional).",
}


NO_SOURCE = ""


def data_source_choices() -> list[tuple[str, str]]:
    """Return the upload form's data_source choices: each scorer with what it expects."""
    return [(NO_SOURCE, "(each row's data_source column; map it below)")] + [
        (source, f"{source} — ground_truth: {expects}")
        for source, expects in DATA_SOURCE_SCORERS.items()
    ]


class KeyMapForm(forms.Form):
    """The data_source the rows are scored by, and one text field per engine field: the file
    column that feeds it (empty: the default)."""

    data_source = forms.ChoiceField(
        required=False,
        label="data_source (reward)",
        help_text="Which reward scores these rows, for rows without a data_source column. "
        "Each choice says what it expects in ground_truth.",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["data_source"].choices = data_source_choices()
        for target in MAP_TARGETS:
            self.fields[f"map_{target}"] = forms.CharField(
                label=f"{target} ←",
                required=False,
                max_length=200,
                help_text=KEY_MAP_HELP.get(target, ""),
            )

    @staticmethod
    def initial_from(key_map: dict[str, str], data_source: str = "") -> dict[str, str]:
        """Return the form's initial values for a stored key map and data_source."""
        return {
            "data_source": data_source,
            **{f"map_{target}": column for target, column in key_map.items()},
        }

    def key_map(self) -> dict[str, str]:
        """Return the cleaned key map (target -> column), empty entries dropped."""
        return {
            target: self.cleaned_data[f"map_{target}"].strip()
            for target in MAP_TARGETS
            if self.cleaned_data.get(f"map_{target}", "").strip()
        }


class DatasetUploadForm(KeyMapForm):
    name = forms.CharField(max_length=200, required=False, help_text="Empty: the file name.")
    file = forms.FileField()

    field_order = ["name", "file", "data_source"]

    def __init__(self, *args, refused_file: str = "", **kwargs) -> None:
        """``refused_file``: why the upload handler dropped the file while it streamed in."""
        super().__init__(*args, **kwargs)
        self.refused_file = refused_file
        self.fields["file"].required = not refused_file
        self.fields["file"].help_text = (
            "verl parquet, JSON Lines (one object per line) or CSV with a header, in UTF-8; up to "
            f"{size_text(settings.POSTTRAIN_UPLOAD_MAX_BYTES)}. The format is read from the "
            "content, not the name."
        )

    def clean_file(self):
        if self.refused_file:
            raise forms.ValidationError(self.refused_file)
        return self.cleaned_data["file"]
