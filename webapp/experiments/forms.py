"""The experiment builder: a Django form generated from the engine's config schema.

Every leaf of ``PPOConfig`` that ``engine.config.iter_field_specs`` lists becomes a field (its
help text, choices, bounds (a number input's ``min`` and ``max``) and basic/advanced flag come
from the schema), named by its dotted key with
``__`` for the dots. Values stay text until ``engine.config.set_value`` converts them, so a bad
value is reported in the engine's words next to its field; the studio's own widgets pick the
dataset, the custom reward function from the installed modules, the weighted reward components
(every name ``reward.components`` accepts, the reward model's score and the custom function
included, in the config's order) and the training mode with its staleness settings
(``webapp.experiments.modes``: synchronous, one-step-off or fully-async). ``clean`` runs the
engine's validator (through ``config_check``) so every error shows at once; the service checks
again when it stores the experiment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml
from django import forms

from engine.config import (
    ConfigError,
    ConfigFieldError,
    ConfigValidationError,
    FieldSpec,
    PPOConfig,
    get_value,
    iter_field_specs,
    set_value,
)
from engine.config.fields import HONOURED
from engine.config.yaml_io import MAX_YAML_BYTES, YamlLimitError, yaml_load
from webapp.datasets.selectors import dataset_list_for_user
from webapp.experiments.configs import STUDIO_MANAGED_KEYS, config_check
from webapp.experiments.modes import (
    FULLY_ASYNC_KEYS,
    HYBRID_ENGINE,
    SYNC,
    TRAINING_MODES,
    VERL_STALENESS_DEFAULTS,
    training_mode_of,
    training_mode_values,
)
from webapp.experiments.rewards import (
    COMPONENT_NOTES,
    list_reward_functions,
    reward_component_names,
    reward_function_for_path,
    unreadable_reward_modules,
)
from webapp.experiments.tags import TagsInvalid
from webapp.experiments.tags import clean_tags as tags_cleaned

CUSTOM_REWARD_KEYS = ("custom_reward_function.path", "custom_reward_function.name")
COMPONENTS_KEY = "reward.components"
# Each upload's own key map and data_source come from its dataset (``attach_dataset_maps``).
DATASET_KEYS = ("data.file_key_maps", "data.file_data_sources")
DATASET_PICKERS = {"data.train_files": "train_dataset", "data.val_files": "val_dataset"}
# The training mode's radio buttons and the fully-async panel set these
# (``webapp.experiments.modes``).
MODE_KEYS = (HYBRID_ENGINE, *FULLY_ASYNC_KEYS)
HIDDEN_KEYS = (
    *STUDIO_MANAGED_KEYS,
    *CUSTOM_REWARD_KEYS,
    COMPONENTS_KEY,
    *DATASET_KEYS,
    *MODE_KEYS,
)


def shown_in_form(spec: FieldSpec) -> bool:
    """Return whether the builder shows a key: honoured keys the studio does not manage.

    Keys with no effect here or refused (docs/config.md) stay at their defaults in the form; a
    YAML import that sets one gets the validator's warning or error.
    """
    return spec.effect == HONOURED and spec.key not in HIDDEN_KEYS


GROUP_LABELS = {
    "data": "Data",
    "model": "Model",
    "actor": "Actor (policy training)",
    "ref": "Reference policy",
    "rollout": "Rollout",
    "actor_rollout_ref": "Actor, rollout and reference",
    "critic": "Critic (value model)",
    "reward_model": "Reward model",
    "custom_reward_function": "Custom reward function",
    "reward": "Reward",
    "algorithm": "Algorithm",
    "trainer": "Trainer",
    "ray_init": "Ray",
    "async_training": "Asynchronous training",
}


def field_name(key: str) -> str:
    """Return the form field name of a dotted config key."""
    return key.replace(".", "__")


def value_text(value: Any) -> Any:
    """Return a config value as the form shows it (YAML flow for lists and dicts)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return value
    if isinstance(value, list | dict):
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return str(value)


def field_label(spec: FieldSpec) -> str:
    """Return the key below its form group: ``optim.lr`` in the actor's group."""
    parts = spec.key.split(".")
    depth = 2 if parts[0] == "actor_rollout_ref" and len(parts) > 2 else 1
    return ".".join(parts[depth:]) or spec.key


def _schema_field(spec: FieldSpec) -> forms.Field:
    label = field_label(spec)
    common = {"label": label, "help_text": spec.help, "required": False}
    if spec.choices and spec.type is list:
        return forms.MultipleChoiceField(
            choices=[(c, c) for c in spec.choices], widget=forms.CheckboxSelectMultiple, **common
        )
    if spec.choices:
        choices = [(c, c) for c in spec.choices]
        if spec.nullable:
            choices = [("", "(null)"), *choices]
        return forms.ChoiceField(choices=choices, **common)
    if spec.type is bool and not spec.nullable:
        return forms.BooleanField(**common)
    if spec.type is bool:
        return forms.ChoiceField(
            choices=[("", "(null)"), ("true", "true"), ("false", "false")], **common
        )
    if spec.type in (list, dict) or spec.type is Any:
        return forms.CharField(widget=forms.TextInput(attrs={"class": "yaml"}), **common)
    return forms.CharField(widget=forms.TextInput(attrs=_number_attrs(spec)), **common)


def _number_attrs(spec: FieldSpec) -> dict[str, Any]:
    """Return a number input's attributes: decimal keyboard, and min/max from the schema's bounds."""
    if spec.type not in (int, float):
        return {}
    attrs: dict[str, Any] = {"inputmode": "decimal"}
    if spec.minimum is not None:
        attrs["min"] = spec.minimum
    if spec.maximum is not None:
        attrs["max"] = spec.maximum
    return attrs


class DatasetSelect(forms.Select):
    """A dataset picker whose options carry the file's path, so the page can show it in
    data.train_files / data.val_files as soon as a dataset is picked."""

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex, attrs)
        instance = getattr(value, "instance", None)
        if instance is not None:
            option["attrs"]["data-path"] = instance.path
        return option


class DatasetChoiceField(forms.ModelChoiceField):
    """An upload, labelled with how the run reads it: its key map and data_source."""

    def label_from_instance(self, obj: Any) -> str:
        mapped = ", ".join(f"{target}←{column}" for target, column in obj.key_map.items())
        source = f"data_source {obj.data_source}" if obj.data_source else "data_source: its column"
        return f"{obj.name} ({'; '.join(p for p in (mapped, source) if p)})"


class ExperimentForm(forms.Form):
    """Name, tags and the whole engine config; ``clean`` leaves the parsed config in ``config``."""

    preset = forms.CharField(widget=forms.HiddenInput, required=False)
    name = forms.CharField(max_length=200)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    tags = forms.CharField(required=False, help_text="Comma-separated, e.g. grpo, tiny.")
    launch = forms.BooleanField(required=False, initial=True, label="Launch a run now")
    train_dataset = DatasetChoiceField(
        queryset=None,
        required=False,
        widget=DatasetSelect(attrs={"data-sets": "data__train_files"}),
        help_text="One of your uploads; sets data.train_files (read with the upload's key map).",
    )
    val_dataset = DatasetChoiceField(
        queryset=None,
        required=False,
        widget=DatasetSelect(attrs={"data-sets": "data__val_files"}),
        help_text="One of your uploads; sets data.val_files (read with the upload's key map).",
    )
    custom_reward = forms.ChoiceField(
        required=False,
        help_text="A function from the reward modules installed on the server.",
    )
    training_mode = forms.ChoiceField(
        label="Mode",
        choices=[(name, mode.label) for name, mode in TRAINING_MODES.items()],
        required=False,
        widget=forms.RadioSelect,
        help_text="Sets actor_rollout_ref.hybrid_engine (and, fully asynchronous, the "
        "async_training staleness keys below).",
    )
    # The weighted components' names in the config's order (a weighted sum does not depend on
    # it, but a config that came back reordered would show as changed).
    reward_order = forms.CharField(widget=forms.HiddenInput, required=False)

    def __init__(self, *args: Any, owner: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.owner = owner
        self.config: PPOConfig | None = None
        self.refused = False  # a field's YAML was refused (see ``_refuse``)
        self.unset: dict[
            str, tuple[Any, str]
        ] = {}  # key -> (text, why): the config kept its default
        self.warnings: list[str] = []
        datasets = dataset_list_for_user(user=owner)
        self.fields["train_dataset"].queryset = datasets
        self.fields["val_dataset"].queryset = datasets
        self.reward_functions = {f.choice: f for f in list_reward_functions()}
        self.unreadable_reward_modules = unreadable_reward_modules()
        self.fields["custom_reward"].choices = [("", "(none)")] + [
            (choice, f"{choice} — {f.doc}" if f.doc else choice)
            for choice, f in self.reward_functions.items()
        ]
        self.reward_names = reward_component_names()
        for name in self.reward_names:
            self.fields[f"reward_weight__{name}"] = forms.CharField(
                required=False,
                label=name,
                help_text=COMPONENT_NOTES.get(name, ""),
                widget=forms.TextInput(attrs={"inputmode": "decimal"}),
            )
            self.fields[f"reward_kwargs__{name}"] = forms.CharField(
                required=False,
                label=f"{name} kwargs",
                widget=forms.TextInput(attrs={"class": "yaml"}),
            )
        self.specs = [s for s in iter_field_specs() if shown_in_form(s)]
        for spec in self.specs:
            self.fields[field_name(spec.key)] = _schema_field(spec)
        for spec in iter_field_specs():
            if spec.key not in FULLY_ASYNC_KEYS:
                continue
            field = self.fields[field_name(spec.key)] = _schema_field(spec)
            if spec.key in VERL_STALENESS_DEFAULTS:
                field.widget.attrs["placeholder"] = f"verl: {VERL_STALENESS_DEFAULTS[spec.key]}"

    # -- initial values ------------------------------------------------------------------------
    @classmethod
    def initial_from_config(cls, config: PPOConfig, owner: Any) -> dict[str, Any]:
        """Return the form's initial values for ``config``."""
        initial: dict[str, Any] = {}
        for spec in iter_field_specs():
            if not (shown_in_form(spec) or spec.key in FULLY_ASYNC_KEYS):
                continue
            value = get_value(config, spec.key)
            if spec.choices and spec.type is list:
                initial[field_name(spec.key)] = list(value or [])
                continue
            if spec.type is bool and spec.nullable and value is not None:
                value = "true" if value else "false"
            initial[field_name(spec.key)] = value_text(value)
        initial["training_mode"] = training_mode_of(config)
        datasets = {d.path: d for d in dataset_list_for_user(user=owner)}
        for key, name in (("data.train_files", "train_dataset"), ("data.val_files", "val_dataset")):
            value = get_value(config, key)
            if isinstance(value, str) and value in datasets:
                initial[name] = datasets[value].pk
        custom = config.custom_reward_function
        function = reward_function_for_path(custom.path, custom.name)
        if function is not None:
            initial["custom_reward"] = function.choice
        initial["reward_order"] = ",".join(c.name for c in config.reward.components)
        for component in config.reward.components:
            initial[f"reward_weight__{component.name}"] = str(component.weight)
            if component.kwargs:
                initial[f"reward_kwargs__{component.name}"] = value_text(component.kwargs)
        return initial

    @staticmethod
    def initial_from_post(form: ExperimentForm, data: Mapping[str, Any]) -> dict[str, Any]:
        """Return the builder's values as posted, as initial values (empty when none came)."""
        if "name" not in data:
            return {}
        initial: dict[str, Any] = {}
        for name, field in form.fields.items():
            if isinstance(field, forms.MultipleChoiceField):
                initial[name] = data.getlist(name) if hasattr(data, "getlist") else data.get(name)
            elif isinstance(field, forms.BooleanField):
                initial[name] = data.get(name) not in (None, "", "false", "off")
            elif name in data:
                initial[name] = data.get(name)
        return initial

    # -- building the config -------------------------------------------------------------------
    def _refuse(self, field: str, error: YamlLimitError) -> None:
        """Show a field's text the YAML reader refused (an alias, a huge value), and stop there.

        ``clean`` then leaves ``config`` None and runs no checks: the preview answers 400.
        """
        self.refused = True
        self.add_error(field, error.message)

    def _set(self, config: PPOConfig, key: str, value: Any, field: str) -> None:
        try:
            set_value(config, key, value)
        except YamlLimitError as exc:
            self._refuse(field, exc)
        except ConfigFieldError as exc:
            self.add_error(field, exc.message)
            self.unset[key] = (value, exc.message)

    def _schema_value(self, spec: FieldSpec, raw: Any) -> Any:
        if isinstance(raw, list) and not raw and spec.nullable:
            return None  # no box ticked on an optional list: the engine's default applies
        if isinstance(raw, str) and spec.item_type is not None and spec.type is str:
            text = raw.strip()
            if text.startswith("["):  # ``str | list[str]`` fields: a YAML list of paths
                return yaml_load(text, spec.key)
        return raw

    def _weighted(self, values: Mapping[str, Any]) -> list[str]:
        """Return the components given a weight in ``values`` (form data), in ``reward_order``'s
        order, then the form's."""
        weighted = [
            n for n in self.reward_names if str(values.get(f"reward_weight__{n}") or "").strip()
        ]
        order = [n for n in str(values.get("reward_order") or "").split(",") if n in weighted]
        return list(dict.fromkeys([*order, *weighted]))

    def _components(self) -> list[dict[str, Any]] | None:
        components = []
        for name in self._weighted(self.cleaned_data):
            weight = (self.cleaned_data.get(f"reward_weight__{name}") or "").strip()
            kwargs_text = (self.cleaned_data.get(f"reward_kwargs__{name}") or "").strip()
            try:
                kwargs = yaml_load(kwargs_text, f"{name} kwargs") if kwargs_text else {}
            except YamlLimitError as exc:
                self._refuse(f"reward_kwargs__{name}", exc)
                return None
            except ConfigError as exc:
                self.add_error(f"reward_kwargs__{name}", str(exc))
                return None
            components.append({"name": name, "weight": weight, "kwargs": kwargs or {}})
        return components

    def clean_tags(self) -> str:
        """Check the tags now, so a bad tag shows beside the config's own errors, not after."""
        text = self.cleaned_data.get("tags") or ""
        try:
            tags_cleaned(text)
        except TagsInvalid as exc:
            raise forms.ValidationError([error.message for error in exc.errors]) from exc
        return text

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        config = PPOConfig()
        for spec in self.specs:
            name = field_name(spec.key)
            if name not in cleaned:
                continue
            try:
                value = self._schema_value(spec, cleaned[name])
            except YamlLimitError as exc:
                self._refuse(name, exc)
                continue
            except ConfigError as exc:
                self.add_error(name, str(exc))
                self.unset[spec.key] = (cleaned[name], str(exc))
                continue
            self._set(config, spec.key, value, name)
        for key, name in (("data.train_files", "train_dataset"), ("data.val_files", "val_dataset")):
            dataset = cleaned.get(name)
            if dataset is not None:  # its key map and data_source: ``config_check``
                self._set(config, key, dataset.path, name)
        panel = {key: cleaned.get(field_name(key)) for key in FULLY_ASYNC_KEYS}
        mode = cleaned.get("training_mode") or SYNC
        for key, value in training_mode_values(mode, panel).items():
            self._set(config, key, value, self.field_for_key(key) or "training_mode")
        function = self.reward_functions.get(cleaned.get("custom_reward") or "")
        if function is not None:
            self._set(config, "custom_reward_function.path", function.path, "custom_reward")
            self._set(config, "custom_reward_function.name", function.name, "custom_reward")
        components = self._components()
        if components is not None:
            try:
                set_value(config, COMPONENTS_KEY, components)
            except ConfigFieldError as exc:
                self.add_error(self.field_for_key(exc.key), exc.message)
        if self.refused:
            return cleaned
        self.config = config
        try:
            self.warnings = config_check(owner=self.owner, config=config)
        except ConfigValidationError as exc:
            self.warnings = exc.warnings
            self.add_config_errors(exc)
        return cleaned

    # -- errors from the engine ----------------------------------------------------------------
    def field_for_key(self, key: str) -> str | None:
        """Return the form field that shows errors of config ``key`` (None: the whole form)."""
        match = re.match(r"reward\.components\[(\d+)\](\.kwargs)?", key)
        if match:
            active = self._weighted(self.data)
            index = int(match.group(1))
            box = "reward_kwargs" if match.group(2) else "reward_weight"
            return f"{box}__{active[index]}" if index < len(active) else None
        if key in CUSTOM_REWARD_KEYS:
            return "custom_reward"
        if key == HYBRID_ENGINE:
            return "training_mode"
        picker = DATASET_PICKERS.get(key)
        if picker and getattr(self, "cleaned_data", {}).get(picker) is not None:
            return picker  # the file is the dataset picked there
        if key in DATASET_KEYS:
            return "train_dataset"
        name = field_name(key)
        return name if name in self.fields or key == "name" else None

    def add_config_errors(self, error: ConfigValidationError) -> None:
        """Show each of the engine's errors next to the field its key names.

        A field whose text could not be read already shows that problem; the validator, which
        saw the default there instead, is not asked about it again.
        """
        for item in error.errors:
            name = self.field_for_key(item.key)
            if name is not None and name in self.errors:
                continue
            self.add_error(name, item.message if name else str(item))

    def field_groups(self, advanced: bool) -> list[tuple[str, list[forms.BoundField]]]:
        """Return (label, bound fields) per schema group, basic or advanced fields only; the
        algorithm first, as it decides which of the other sections matter (the critic's)."""
        groups: dict[str, list[forms.BoundField]] = {}
        for spec in sorted(self.specs, key=lambda s: s.group != "algorithm"):
            if spec.advanced == advanced:
                groups.setdefault(spec.group, []).append(self[field_name(spec.key)])
        return [(GROUP_LABELS.get(g, g), fields) for g, fields in groups.items()]

    def error_summary(self) -> list[tuple[str, str, str]]:
        """Return (anchor, what, message) for every error, in the page's order, for the summary
        at the top of the builder: a field's anchor is its input's id, the form's is empty."""
        order = [
            "name", "description", "tags", "train_dataset", "val_dataset",
            *(f"reward_weight__{n}" for n in self.reward_names),
            *(f"reward_kwargs__{n}" for n in self.reward_names), "custom_reward",
            "training_mode", *(field_name(k) for k in FULLY_ASYNC_KEYS),
            *(field_name(s.key) for s in self.specs if not s.advanced and s.group == "algorithm"),
            *(field_name(s.key) for s in self.specs if not s.advanced and s.group != "algorithm"),
            *(field_name(s.key) for s in self.specs if s.advanced),
        ]  # fmt: skip
        rank = {name: i for i, name in enumerate(order)}
        summary = [("", "", str(m)) for m in self.non_field_errors()]
        for name in sorted(
            (n for n in self.errors if n != "__all__"), key=lambda n: rank.get(n, len(rank))
        ):
            bound = self[name]
            spec_key = name.replace("__", ".")
            keys = {*(s.key for s in self.specs), *FULLY_ASYNC_KEYS}
            what = spec_key if spec_key in keys else str(bound.label)
            summary += [(bound.auto_id or "", what, str(m)) for m in self.errors[name]]
        return summary

    def fully_async_fields(self) -> list[forms.BoundField]:
        """Return the fully-async panel's fields, in ``FULLY_ASYNC_KEYS``' order."""
        return [self[field_name(key)] for key in FULLY_ASYNC_KEYS]

    def reward_rows(self) -> list[tuple[forms.BoundField, forms.BoundField]]:
        """Return (weight, kwargs) bound fields per built-in reward, for the composite table."""
        return [
            (self[f"reward_weight__{n}"], self[f"reward_kwargs__{n}"]) for n in self.reward_names
        ]


BUILDER = {"form": "builder-form"}


class YamlImportForm(forms.Form):
    """A config in YAML or verl's key=value lines, pasted or uploaded, to open in the builder.

    Its fields belong to the builder's form (``form="builder-form"``), so an import posts the
    builder's values too and a refused import gives them back unchanged.
    """

    yaml_file = forms.FileField(
        required=False, label="YAML file", widget=forms.ClearableFileInput(attrs=BUILDER)
    )
    yaml_text = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, **BUILDER}),
        label="or paste YAML or key=value lines",
        help_text="YAML sections or dotted keys (algorithm.adv_estimator: grpo), or verl's "
        "command-line overrides, one per line (algorithm.adv_estimator=grpo, +key=value); "
        "override lines apply to the preset open in the builder.",
    )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        upload = cleaned.get("yaml_file")
        if upload is not None and upload.size > MAX_YAML_BYTES:
            raise forms.ValidationError(
                f"the file is {upload.size:,} bytes, over the limit of {MAX_YAML_BYTES:,}; "
                "a config is a few kilobytes"
            )
        if upload is not None:
            try:
                cleaned["text"] = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                raise forms.ValidationError("the file is not UTF-8 text") from None
        else:
            cleaned["text"] = cleaned.get("yaml_text") or ""
        if not cleaned["text"].strip():
            raise forms.ValidationError("upload a YAML file or paste its text")
        return cleaned
