"""``data``: the training and validation files, their columns, lengths and batch sizes.

verl's ``data`` section (``verl/trainer/config/data/legacy_data.yaml``). Its rules are at the end:
the files to train and validate on, the column map, DAPO's generation batch. That the batch splits
evenly over the workers is checked with the actor's batches (``engine.config.actor``).
"""

from dataclasses import dataclass
from typing import Any

from engine.config.fields import (
    _MULTIMODAL,
    MAX_BATCH,
    MAX_TOKENS,
    MAX_WORKERS,
    ConfigFieldError,
    Validation,
    _f,
    _inert,
    _refused,
    _Section,
    _section,
)
from engine.config.files import file_problems, paths_of
from engine.config.unsupported import ClassFileConfig

DATA_KEY_MAP_TARGETS = ("prompt", "ground_truth", "data_source", "ability")
# verl's spellings of a class's module (``load_extern_object``): a file, or an importable module.
FILE_PREFIX, PACKAGE_PREFIX = "file://", "pkg://"


@dataclass
class CustomDatasetConfig(_Section):
    path: str | None = _f(
        None,
        "Python file (or pkg://module) with a dataset class (a torch Dataset subclass) used "
        "instead of the engine's for the training and validation files; built as verl builds "
        "it, cls(data_files=, tokenizer=, processor=None, config=<data>, max_samples=). Its "
        "code runs in the trainer: the studio takes only a file in the installed reward "
        "modules folder.",
        resource="code",
    )
    name: str | None = _f(None, "Class name in data.custom_cls.path.")


@dataclass
class SamplerConfig(_Section):
    class_path: str | None = _f(
        None,
        "Python file (or pkg://module) with a sampler class (engine.data.sampler."
        "AbstractSampler, a torch Sampler) that orders the training data instead of "
        "data.shuffle; built as cls(data_source=<dataset>, data_config=<data>). A curriculum "
        "sampler (AbstractCurriculumSampler) gets update(batch=) after every step. Needs "
        "data.dataloader_num_workers=0, as in verl. Its code runs in the trainer: the studio "
        "takes only a file in the installed reward modules folder.",
        resource="code",
    )
    class_name: str | None = _f(None, "Class name in data.sampler.class_path.")


@dataclass
class DataConfig(_Section):
    tokenizer: str | None = _f(
        None, "Tokenizer folder for the data; null uses the actor's.", resource="path"
    )
    train_files: str | list[str] | None = _f(
        None,
        "Training data: a parquet/JSONL/CSV file or a list of them.",
        basic=True,
        resource="path",
    )
    val_files: str | list[str] | None = _f(
        None,
        "Validation data (needed when trainer.test_freq > 0 or val_before_train).",
        basic=True,
        resource="path",
    )
    prompt_key: str = _f("prompt", "Column holding the prompt (chat messages or text).")
    reward_fn_key: str = _f("data_source", "Column that selects the reward function.")
    max_prompt_length: int = _f(512, "Longest prompt in tokens.", basic=True, gt=0, le=MAX_TOKENS)
    max_response_length: int = _f(
        512, "Most tokens generated per response.", basic=True, gt=0, le=MAX_TOKENS
    )
    train_batch_size: int = _f(1024, "Prompts per training step.", basic=True, gt=0, le=MAX_BATCH)
    val_batch_size: int | None = _f(
        None, "Prompts per validation batch; null: whole set.", gt=0, le=MAX_BATCH
    )
    gen_batch_size: int | None = _f(
        None,
        "Prompts per generation batch with algorithm.filter_groups (DAPO); null: train_batch_size.",
        gt=0,
        le=MAX_BATCH,
    )
    return_raw_input_ids: bool = _inert(False, "Also return unpadded prompt ids.")
    return_raw_chat: bool = _f(False, "Also return the prompt as chat messages.")
    return_full_prompt: bool = _inert(
        False, "Also return the prompt with the chat template applied."
    )
    shuffle: bool = _f(True, "Shuffle the training data each epoch.")
    validation_shuffle: bool = _inert(
        False, "Shuffle the validation data (validation scores every row either way)."
    )
    seed: int | None = _f(1, "Seed of the training data shuffle; null: trainer.seed.")
    dataloader_num_workers: int = _f(
        8,
        "Data loader worker processes, as verl; this engine reads the data in the driver, so "
        "only verl's rule is read: data.sampler needs 0.",
        ge=0,
        le=MAX_WORKERS,
    )
    truncation: str = _f(
        "error",
        "What to do with a prompt over max_prompt_length.",
        choices=("error", "left", "right", "middle"),
    )
    filter_overlong_prompts: bool = _f(False, "Drop prompts longer than max_prompt_length.")
    trust_remote_code: bool = _f(False, "Allow custom tokenizer code from the model folder.")
    data_key_map: dict[str, str] = _f(
        {}, "Column mapping target->source, e.g. {prompt: question, ground_truth: answer}."
    )
    file_key_maps: dict[str, dict[str, str]] = _f(
        {},
        "Column maps of single files, {file: {target: column}}, as the file is named in "
        "train_files/val_files; a file listed here is read with its own map instead of "
        "data_key_map (an upload's map then never touches the preset's validation set).",
    )
    file_data_sources: dict[str, str] = _f(
        {},
        "data_source of single files' rows that have no data_source column, {file: name} (a "
        "name the default reward scores); unlisted files use their file name, as verl does.",
    )
    use_shm: bool = _inert(False, "Copy the data through shared memory first.")
    train_max_samples: int = _f(
        -1,
        "Use only N training rows: the first N, or with shuffle N drawn with seed (as verl); "
        "-1: all (N over the row count: all).",
        ge=-1,
        le=MAX_BATCH * 1024,
    )
    val_max_samples: int = _f(
        -1,
        "Use only N validation rows: the first N, or with shuffle N drawn with seed (as verl); "
        "-1: all (N over the row count: all).",
        ge=-1,
        le=MAX_BATCH * 1024,
    )
    tool_config_path: str | None = _f(
        None,
        "Tools YAML of the dataset; null: rollout.multi_turn.tool_config_path.",
        resource="path",
        follows="actor_rollout_ref.rollout.multi_turn.tool_config_path",
    )
    image_patch_size: int = _inert(14, "Vision patch size of multimodal data.")
    filter_overlong_prompts_workers: int = _inert(1, "Processes filtering overlong prompts.")
    image_key: str = _refused("images", "Column holding a row's images.", _MULTIMODAL)
    video_key: str = _refused("videos", "Column holding a row's videos.", _MULTIMODAL)
    custom_cls: CustomDatasetConfig = _section(CustomDatasetConfig, "A custom dataset class.")
    return_multi_modal_inputs: bool = _inert(True, "Return multimodal inputs with each row.")
    sampler: SamplerConfig = _section(SamplerConfig, "A custom (curriculum) sampler.")
    datagen: ClassFileConfig = _section(ClassFileConfig, "A dynamic data generator.")
    apply_chat_template_kwargs: dict[str, Any] = _f(
        {},
        "Keyword arguments of the chat template, for prompts and multi-turn turns "
        "(e.g. {enable_thinking: false}).",
    )


def data_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of the data keys: the files (needed, and for validation when the trainer
    validates), the column map and DAPO's generation batch; warn when no validation data is set."""
    data: DataConfig = v.cfg.data
    trainer = v.cfg.trainer
    errors = []
    if not paths_of(data.train_files):
        errors.append(
            ConfigFieldError(
                "data.train_files",
                data.train_files,
                "set it to a parquet, JSONL or CSV file (tiny://train.parquet: the embedded task)",
            )
        )
    if not paths_of(data.val_files) and trainer.test_freq > 0:
        errors.append(
            ConfigFieldError(
                "data.val_files",
                data.val_files,
                f"validation is on (trainer.test_freq={trainer.test_freq}); set data.val_files, "
                "or turn validation off with trainer.test_freq=-1",
            )
        )
    elif not paths_of(data.val_files) and trainer.val_before_train:
        # verl's default is on; a run given no validation data (a tutorial's) still trains.
        v.warnings.append(
            "data.val_files is not set: the validation before training "
            "(trainer.val_before_train=True, verl's default) is skipped; set data.val_files to "
            "validate, or trainer.val_before_train=False to silence this"
        )
    for target, column in data.data_key_map.items():
        if target not in DATA_KEY_MAP_TARGETS or not column:
            errors.append(
                ConfigFieldError(
                    f"data.data_key_map.{target}",
                    column,
                    f"targets are {', '.join(DATA_KEY_MAP_TARGETS)}, each mapped to a source "
                    "column (e.g. data.data_key_map.prompt=question)",
                )
            )
    for file, key_map in data.file_key_maps.items():
        for target, column in key_map.items():
            if target not in DATA_KEY_MAP_TARGETS or not column:
                errors.append(
                    ConfigFieldError(
                        "data.file_key_maps",
                        {file: key_map},
                        f"{file}: targets are {', '.join(DATA_KEY_MAP_TARGETS)}, each mapped to a "
                        "source column (e.g. {prompt: question})",
                    )
                )
    if data.gen_batch_size is not None and not v.cfg.algorithm.filter_groups.enable:
        errors.append(
            ConfigFieldError(
                "data.gen_batch_size",
                data.gen_batch_size,
                "is read only with algorithm.filter_groups.enable=True (DAPO's dynamic sampling); "
                "unset it or enable filter_groups",
            )
        )
    if data.gen_batch_size is not None and data.gen_batch_size < data.train_batch_size:
        errors.append(
            ConfigFieldError(
                "data.gen_batch_size",
                data.gen_batch_size,
                f"must be at least data.train_batch_size={data.train_batch_size}: each generation "
                "batch should be able to fill the step (DAPO generates about 3x as many)",
            )
        )
    errors += _class_file_problems(v)
    if v.check_files:
        for key, files in (
            ("data.train_files", data.train_files),
            ("data.val_files", data.val_files),
        ):
            for value in paths_of(files):
                errors += file_problems(v, key, value, "check the path, or upload the data")
        if data.tokenizer:
            errors += file_problems(
                v, "data.tokenizer", data.tokenizer, "point it at a tokenizer folder"
            )
    return errors


def _class_file_problems(v: Validation) -> list[ConfigFieldError]:
    """Return the errors of data.custom_cls and data.sampler: a class named without its file or
    a file without its class, a sampler with loader workers (verl's rule), and with
    ``check_files`` a file that is not there (a ``pkg://`` module is looked for as the trainer
    starts). The classes load as the trainer starts (``engine.data.custom``): validating runs no
    code."""
    data: DataConfig = v.cfg.data
    errors = []
    for section, path, name in (
        ("data.custom_cls", ("path", data.custom_cls.path), ("name", data.custom_cls.name)),
        (
            "data.sampler",
            ("class_path", data.sampler.class_path),
            ("class_name", data.sampler.class_name),
        ),
    ):
        (path_key, path_value), (name_key, name_value) = path, name
        if path_value and not name_value:
            errors.append(
                ConfigFieldError(
                    f"{section}.{name_key}",
                    name_value,
                    f"set it to the name of the class in {section}.{path_key}={path_value!r}",
                )
            )
        if name_value and not path_value:
            errors.append(
                ConfigFieldError(
                    f"{section}.{path_key}",
                    path_value,
                    f"{section}.{name_key}={name_value!r} is set; set {path_key} to the Python "
                    f"file defining it, or drop {name_key}",
                )
            )
        if v.check_files and path_value and not path_value.startswith(PACKAGE_PREFIX):
            errors += file_problems(
                v,
                f"{section}.{path_key}",
                path_value.removeprefix(FILE_PREFIX),
                "point it at a Python file",
            )
    if data.sampler.class_path and data.dataloader_num_workers != 0:
        errors.append(
            ConfigFieldError(
                "data.dataloader_num_workers",
                data.dataloader_num_workers,
                "must be 0 with data.sampler.class_path, as verl requires: a loader that reads "
                "ahead would hand out batches before a curriculum sampler's update could "
                "reorder them; set data.dataloader_num_workers=0",
            )
        )
    return errors
