"""The dataset <-> reward contract, checked wherever a config is created (builder, YAML import,
API, sweeps) before a run finds out at its start.

``attach_dataset_maps`` gives every upload the config names by its path its dataset's key map and
data_source (``data.file_key_maps`` / ``data.file_data_sources``), so a config sent through the
API that names an upload reads it as the upload page showed it, and an upload's map never applies
to another file (the preset's ``tiny://val.parquet`` kept beside an uploaded train set).

``data_contract_problems`` reads the first ``SAMPLE_ROWS`` rows of each data file (in the
preview's memory-limited child process: uploads are untrusted) and reports:

- a file whose columns do not fit the key map it is read with;
- a ``data_source`` that no reward scores, when the rewards dispatch on it (the default reward;
  a custom function or a reward model covers every source);
- prompts longer than ``data.max_prompt_length`` (tokenised with the run's tokenizer and chat
  template), with how many and by how much, offering verl's ``data.filter_overlong_prompts``.

Only files and tokenizers that passed the studio's path checks are read (``skip`` names the
keys that did not). With a dataset class (``data.custom_cls``, from the installed modules) the
files are the class's to read, so none is read here.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection
from functools import lru_cache
from pathlib import Path
from typing import Any

from engine.config import ConfigFieldError, PPOConfig, resolve_config
from engine.config.files import paths_of
from engine.data.preview import DatasetPreview, preview_untrusted
from engine.rewards.names import DATA_SOURCE_SCORERS

SAMPLE_ROWS = 64
TOKENIZER_KEYS = (
    "data.tokenizer",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.tokenizer_path",
    "actor_rollout_ref.model.custom_chat_template",
)
_TINY = "tiny://"
_SAMPLES: dict[tuple[Any, ...], DatasetPreview] = {}
_MAX_CACHED = 64


def attach_dataset_maps(*, owner: Any, config: PPOConfig) -> None:
    """Give each of ``owner``'s uploads named in the data files its key map and data_source,
    unless the config already gives that file its own."""
    from webapp.datasets.selectors import DatasetUnusable, dataset_usable_for

    data = config.data
    for file in [*paths_of(data.train_files), *paths_of(data.val_files)]:
        if file.startswith(_TINY) or "${" in file or not Path(file).expanduser().is_absolute():
            continue
        try:
            dataset = dataset_usable_for(owner=owner, path=file)
        except DatasetUnusable:
            continue  # config_check reports it on its key
        if file not in data.file_key_maps and dataset.key_map:
            data.file_key_maps[file] = dict(dataset.key_map)
        if file not in data.file_data_sources and dataset.data_source:
            data.file_data_sources[file] = dataset.data_source


def uses_data_source_dispatch(config: PPOConfig, *, validation: bool) -> bool:
    """Return whether rewards are picked by each row's data_source (``default_compute_score``),
    as ``engine.trainer.build.build_reward_manager`` decides."""
    names = [c.name for c in config.reward.components or []]
    if validation:  # verl's val_reward_fn leaves the reward model out
        names = [n for n in names if n != "reward_model"]
    if names:
        return "default" in names
    if config.custom_reward_function.path:
        return False
    return validation or not config.reward_model.enable


def _local(value: str) -> Path | None:
    """Return the file to read for a data path, or None for a remote URI."""
    if value.startswith(_TINY):
        from engine.tiny import resolve_tiny_path

        return Path(resolve_tiny_path(value))
    if "://" in value:
        return None
    return Path(value).expanduser()


def sample_file(path: Path, key_map: dict[str, str], data_source: str) -> DatasetPreview:
    """Return the first ``SAMPLE_ROWS`` rows of ``path`` mapped, read in a bounded child process
    (cached while the file is unchanged)."""
    from webapp.datasets.services import preview_limits

    stat = path.stat()
    key = (
        str(path),
        stat.st_mtime_ns,
        stat.st_size,
        json.dumps(key_map, sort_keys=True),
        data_source,
    )
    if key not in _SAMPLES:
        if len(_SAMPLES) >= _MAX_CACHED:
            _SAMPLES.pop(next(iter(_SAMPLES)))
        _SAMPLES[key] = preview_untrusted(
            path,
            data_key_map=key_map or None,
            n=SAMPLE_ROWS,
            limits=preview_limits(),
            data_source=data_source,
            keep_prompts=True,
        )
    return _SAMPLES[key]


@lru_cache(maxsize=4)
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def prompt_lengths(config: PPOConfig, prompts: list[list[dict[str, Any]]]) -> list[int] | None:
    """Return each prompt's length in tokens as the run renders it, or None when the tokenizer
    cannot be loaded here."""
    model = config.actor_rollout_ref.model
    if config.data.trust_remote_code or model.trust_remote_code or model.custom_chat_template:
        return None  # never run a member's code or template in the web process
    folder = config.data.tokenizer or model.tokenizer_path or model.path
    try:
        local = _local(str(folder))
        if local is None or not local.is_dir():
            return None
        tokenizer = _tokenizer(str(local.resolve()))
    except (OSError, ValueError):
        return None
    if tokenizer.chat_template is None:
        return None
    kwargs = dict(config.data.apply_chat_template_kwargs or {})
    texts = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False, **kwargs)
        for p in prompts
    ]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _map_origin(config: PPOConfig, file: str) -> str:
    if file in config.data.file_key_maps:
        return f"its own key map {config.data.file_key_maps[file]} (data.file_key_maps)"
    if config.data.data_key_map:
        return (
            f"data.data_key_map {config.data.data_key_map}, which applies to every file without "
            "its own map (pick an upload as a dataset to read it with its own)"
        )
    return "no key map"


def _length_problem(
    config: PPOConfig, lengths: list[int]
) -> tuple[ConfigFieldError | None, str | None]:
    data = config.data
    limit = data.max_prompt_length
    over = [n for n in lengths if n > limit]
    if not over:
        return None, None
    longest = max(over)
    found = (
        f"{len(over)} of the {len(lengths)} prompts sampled from the data files are longer than "
        f"data.max_prompt_length={limit} tokens (the longest {longest}, {longest - limit} over)"
    )
    if data.filter_overlong_prompts:
        return None, f"{found}; data.filter_overlong_prompts=True drops them"
    if data.truncation != "error":
        return None, f"{found}; data.truncation={data.truncation} cuts them"
    fix = (
        "set data.filter_overlong_prompts=True to drop them (as verl does), raise "
        f"data.max_prompt_length to {longest}, or set data.truncation=left"
    )
    return ConfigFieldError("data.max_prompt_length", limit, f"{found}; {fix}"), None


def data_contract_problems(
    *, config: PPOConfig, skip: Collection[str] = ()
) -> tuple[list[ConfigFieldError], list[str]]:
    """Return (errors, warnings) of the data files against their key maps, rewards and
    ``data.max_prompt_length``; keys in ``skip`` (refused or missing files) are not read."""
    try:
        resolved = resolve_config(copy.deepcopy(config))
    except ConfigFieldError:
        return [], []
    data = config.data
    if data.custom_cls.path and "data.custom_cls.path" not in skip:
        return [], [
            "the data files were not checked against their key maps, rewards and "
            "data.max_prompt_length: data.custom_cls reads them with its own dataset class, "
            "which the run builds as it starts"
        ]
    errors: list[ConfigFieldError] = []
    warnings: list[str] = []
    prompts: list[list[dict[str, Any]]] = []
    for key, typed, values, validation in (
        ("data.train_files", data.train_files, resolved.data.train_files, False),
        ("data.val_files", data.val_files, resolved.data.val_files, True),
    ):
        if key in skip:
            continue
        dispatch = data.reward_fn_key == "data_source" and uses_data_source_dispatch(
            config, validation=validation
        )
        for file, value in zip(paths_of(typed), paths_of(values), strict=False):
            try:
                local = _local(value)
            except ValueError:
                continue  # an unknown tiny:// name: the engine's validator names it
            if local is None or not local.is_file():
                continue
            key_map = data.file_key_maps.get(file, data.data_key_map)
            sample = sample_file(local, dict(key_map), data.file_data_sources.get(file, ""))
            if sample.errors:
                found = sample.errors[0].replace(str(local), file)  # as typed, not the cache's
                message = f"{found} (it is read with {_map_origin(config, file)})"
                errors.append(ConfigFieldError(key, file, message))
                continue
            prompts += sample.prompts
            unscored = [s for s in sample.data_sources if s not in DATA_SOURCE_SCORERS]
            if dispatch and unscored:
                errors.append(
                    ConfigFieldError(
                        key,
                        file,
                        f"its rows' data_source {', '.join(repr(s) for s in unscored)} has no "
                        f"reward (the default reward scores {', '.join(DATA_SOURCE_SCORERS)}); "
                        "pick the data_source on the dataset's page (or map a column naming one), "
                        "or choose a custom reward function that scores it",
                    )
                )
    if prompts and not set(skip) & set(TOKENIZER_KEYS):
        lengths = prompt_lengths(resolved, prompts)
        if lengths is None:
            warnings.append(
                "prompt lengths were not checked against data.max_prompt_length: the tokenizer "
                "cannot be read here (a custom chat template, remote code, or no folder yet); "
                "the run checks them when it loads the data"
            )
        if lengths is not None:
            error, warning = _length_problem(config, lengths)
            errors += [error] if error else []
            warnings += [warning] if warning else []
    return errors, warnings


def validation_data_sources(config: PPOConfig) -> list[str] | None:
    """Return the data sources in the first rows of the validation files, sorted; None when a
    file cannot be read here (a remote URI, a missing or unmappable file)."""
    try:
        resolved = resolve_config(copy.deepcopy(config))
    except ConfigFieldError:
        return None
    data = config.data
    found: set[str] = set()
    for file, value in zip(
        paths_of(data.val_files), paths_of(resolved.data.val_files), strict=False
    ):
        try:
            local = _local(value)
        except ValueError:
            return None
        if local is None or not local.is_file():
            return None
        key_map = data.file_key_maps.get(file, data.data_key_map)
        sample = sample_file(local, dict(key_map), data.file_data_sources.get(file, ""))
        if sample.errors:
            return None
        found.update(sample.data_sources)
    return sorted(found)
