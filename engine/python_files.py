"""Executing a Python file as a module of its own: custom reward functions, interactions, and
dataset and sampler classes, each loaded from a file a key names.

The module is named ``<prefix>_<12 hex digits of the SHA-1 of the file's path>``, so one file is
one module however often it is loaded, and two files never share a name. It is registered in
``sys.modules`` before it runs (pickling and dataclasses look a class's module up there) and
removed again if running it raises; each caller turns the exception into its own key's error.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


class NotPythonModule(ImportError):
    """The file cannot be loaded as a Python module at all (nothing of it ran)."""


def exec_python_file(file: Path, prefix: str) -> ModuleType:
    """Execute ``file`` as a module named from ``prefix`` (see the module doc) and return it.

    ``NotPythonModule`` when no loader takes the file; any exception the file raises as it runs
    propagates, with the module removed from ``sys.modules``.
    """
    name = f"{prefix}_{hashlib.sha1(str(file).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise NotPythonModule(f"{file} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
