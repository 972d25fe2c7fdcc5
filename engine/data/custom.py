"""A dataset class and a sampler class of the user's, from Python files, as verl's
``create_rl_dataset`` and ``create_rl_sampler`` load them.

``data.custom_cls.path`` / ``name`` name a ``torch.utils.data.Dataset`` subclass, built for the
training files and again for the validation files as verl builds it::

    cls(data_files=[...], tokenizer=tokenizer, processor=None, config=data, max_samples=N)

where ``data`` is the ``data`` section as verl passes it (an OmegaConf ``DictConfig``). A subclass
of :class:`engine.data.dataset.RLHFDataset` yields the engine's prompts itself; any other
dataset yields verl's rows (``raw_prompt`` chat messages, or the ``data.prompt_key`` column;
``data_source``, ``reward_model``, ``extra_info``, ...), which :class:`CustomPrompts` renders with
the chat template and cuts to ``data.max_prompt_length`` as the engine's own rows are.

``data.sampler.class_path`` / ``class_name`` name a ``torch.utils.data.Sampler`` subclass
(``engine.data.sampler.AbstractSampler``), built as ``cls(data_source=dataset,
data_config=data)``; the training loader takes its order from it.

Both run the file's code in this process, so they are for runs started by hand
(``python -m engine.main_ppo``); the studio takes them only from the modules folder an
administrator installed (``POSTTRAIN_REWARD_MODULES_DIR``, docs/security.md). Each failure is a
``ConfigFieldError`` naming the key and the fix: a missing file, a file that fails to import, a
missing class, a class of the wrong kind, a constructor that fails.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence, Sized
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from engine.config.data import FILE_PREFIX, PACKAGE_PREFIX
from engine.config.fields import ConfigFieldError
from engine.data.dataset import PromptDataset, RLHFDataset
from engine.data.rows import DatasetError, normalise_row
from engine.python_files import NotPythonModule, exec_python_file

DATASET_CALL = "cls(data_files=..., tokenizer=..., processor=None, config=..., max_samples=...)"
SAMPLER_CALL = "cls(data_source=dataset, data_config=...)"


def load_class(path: str, name: str | None, *, keys: tuple[str, str], base: type) -> type:
    """Return the class ``name`` of the module ``path`` names, a subclass of ``base``.

    ``path`` is verl's: a Python file (``file://`` may prefix it), or ``pkg://a.b.c`` (or
    ``pkg://a/b/c``), a module imported by its name. ``keys`` are the config keys of the module
    and of the class name, which the errors name.
    """
    path_key, name_key = keys
    if not name:
        raise ConfigFieldError(name_key, name, f"set it to the name of the class in {path}")
    if path.startswith(PACKAGE_PREFIX):
        module, where = _import_package(path, path_key), path
    else:
        file = Path(path.removeprefix(FILE_PREFIX)).expanduser().resolve()
        module, where = _import_file(file, path, path_key), str(file)
    cls = getattr(module, name, None)
    if cls is None:
        classes = sorted(n for n, v in vars(module).items() if isinstance(v, type))
        raise ConfigFieldError(
            name_key,
            name,
            f"{where} defines no {name!r}; its classes: {', '.join(classes) or 'none'}",
        )
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigFieldError(
            name_key,
            name,
            f"{name} in {where} is not a subclass of {base.__module__}.{base.__qualname__}; "
            f"derive it from {base.__qualname__}",
        )
    return cls


def _import_package(path: str, path_key: str) -> ModuleType:
    """Import the module ``pkg://a.b.c`` names (verl's spelling of an importable module)."""
    module_name = path.removeprefix(PACKAGE_PREFIX).replace("/", ".")
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise ConfigFieldError(
            path_key, path, "pkg:// names a module by its dotted name, e.g. pkg://my_pkg.samplers"
        )
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigFieldError(
            path_key,
            path,
            f"module {module_name} failed to import: {type(exc).__name__}: {exc}; install it, "
            "or point the key at its Python file",
        ) from exc


def _import_file(file: Path, path: str, path_key: str) -> ModuleType:
    """Execute the Python file ``file`` as a module of its own and return it."""
    if not file.is_file():
        raise ConfigFieldError(
            path_key, path, f"{file} is not a file; point it at the Python file defining the class"
        )
    try:
        return exec_python_file(file, "posttrain_custom_data")
    except NotPythonModule:
        raise ConfigFieldError(
            path_key, path, f"{file} cannot be loaded as a Python module"
        ) from None
    except Exception as exc:
        raise ConfigFieldError(
            path_key, path, f"{file} failed to import: {type(exc).__name__}: {exc}; fix the file"
        ) from exc


def dataset_class(path: str, name: str | None) -> type[Dataset]:
    """Return ``data.custom_cls``'s dataset class."""
    return load_class(
        path, name, keys=("data.custom_cls.path", "data.custom_cls.name"), base=Dataset
    )


def build_custom_dataset(
    cls: type[Dataset],
    files: Sequence[str],
    tokenizer: Any,
    data_config: Any,
    *,
    max_samples: int,
    prompt_settings: Any,
) -> PromptDataset:
    """Build ``cls`` for ``files`` as verl does and return its prompts.

    ``data_config`` is what the class gets (verl's ``DictConfig`` of the ``data`` section);
    ``prompt_settings`` the ``data`` section that renders a verl row's prompt
    (:class:`CustomPrompts`).
    """
    try:
        dataset = cls(  # type: ignore[call-arg]
            data_files=list(files),
            tokenizer=tokenizer,
            processor=None,
            config=data_config,
            max_samples=max_samples,
        )
    except Exception as exc:
        raise ConfigFieldError(
            "data.custom_cls.name",
            cls.__name__,
            f"{cls.__name__} could not be built for {list(files)}: {type(exc).__name__}: {exc}; "
            f"it is called as verl calls it, {DATASET_CALL}",
        ) from exc
    if not isinstance(dataset, Sized):
        raise ConfigFieldError(
            "data.custom_cls.name",
            cls.__name__,
            f"{cls.__name__} has no __len__; the loader needs the number of rows, so define it",
        )
    if isinstance(dataset, RLHFDataset):
        return dataset
    return CustomPrompts(dataset, tokenizer, prompt_settings)


class CustomPrompts(PromptDataset):
    """The rows of a custom dataset, made into the engine's prompts.

    A row is verl's: a dict with the prompt as chat messages under ``raw_prompt`` (verl's
    dataset hands them to its rollout that way) or, without one, in the ``data.prompt_key``
    column (a string is one user message); ``data_source``, ``ability``, ``reward_model`` and
    ``extra_info`` as in a data file, where a missing ``data_source`` is the class's name, and
    ``index`` (else the row's position). Tensors (verl's tokenised prompt, its ``dummy_tensor``)
    are dropped: the prompt is rendered again with the chat template; every other column goes
    into ``extra_info``, as a data file's extra columns do. ``source`` is the user's dataset: its
    own methods (verl's ``on_batch_end``) are called on it, not on this view.
    """

    def __init__(self, source: Any, tokenizer: Any, config: Any):
        super().__init__(tokenizer, config)
        self.source = source
        self.name = type(source).__name__

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> dict[str, Any]:
        location = f"data.custom_cls {self.name}[{i}]"
        row = self.source[i]
        if not isinstance(row, Mapping):
            raise DatasetError(
                f"{location} is a {type(row).__name__}, not a dict; return verl's row, e.g. "
                "{'raw_prompt': [{'role': 'user', 'content': ...}], 'data_source': ..., "
                "'reward_model': {'ground_truth': ...}}"
            )
        raw = {str(k): v for k, v in row.items() if not isinstance(v, torch.Tensor | np.ndarray)}
        prompt_key = "raw_prompt" if "raw_prompt" in raw else self.prompt_key
        index = raw.pop("index", i)
        record = normalise_row(
            raw, location=location, key_map={}, prompt_key=prompt_key, default_source=self.name
        )
        self.add_reward_key(record, list(raw), location)
        record["index"] = int(index) if isinstance(index, int | np.integer) else i
        return self.prompt_item(record, location)


def build_sampler(path: str, name: str | None, dataset: Any, data_config: Any) -> Sampler:
    """Return ``data.sampler``'s sampler, built as verl builds it."""
    cls = load_class(
        path, name, keys=("data.sampler.class_path", "data.sampler.class_name"), base=Sampler
    )
    try:
        return cls(data_source=dataset, data_config=data_config)  # type: ignore[call-arg]
    except Exception as exc:
        raise ConfigFieldError(
            "data.sampler.class_name",
            name,
            f"{name} could not be built: {type(exc).__name__}: {exc}; it is called as verl calls "
            f"it, {SAMPLER_CALL}",
        ) from exc
