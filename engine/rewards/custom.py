"""Load a user's reward function from a Python file (``custom_reward_function.path/name``).

As verl's ``get_custom_reward_fn``: the file is executed as a module, the function is looked up
by name and called with ``reward_kwargs`` added to every call. The returned object is a small
class rather than a closure so that it can be sent to worker processes: it pickles as
``(path, name, reward_kwargs)`` and a worker loads the file again on first use.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.python_files import NotPythonModule, exec_python_file


def _load_module(path: Path) -> ModuleType:
    """Execute the file at ``path`` as a module and return it."""
    try:
        return exec_python_file(path, "posttrain_custom_reward")
    except NotPythonModule:
        raise ImportError(
            f"custom reward file {path} cannot be loaded as a Python module"
        ) from None
    except SyntaxError as exc:
        raise SyntaxError(
            f"custom reward file {path} has a syntax error at line {exc.lineno}: {exc.msg}"
        ) from exc
    except Exception as exc:
        line = next(
            (
                f.lineno
                for f in reversed(traceback.extract_tb(exc.__traceback__))
                if f.filename == str(path)
            ),
            None,
        )
        where = f" at line {line}" if line else ""
        raise ImportError(
            f"custom reward file {path} failed to load{where}: {type(exc).__name__}: {exc}"
        ) from exc


class CustomRewardFn:
    """A reward function loaded from a file, called with ``reward_kwargs`` added."""

    def __init__(self, path: str | Path, name: str, reward_kwargs: Mapping[str, Any] | None = None):
        self.path = Path(path).expanduser().resolve()
        self.name = name
        self.reward_kwargs = dict(reward_kwargs or {})
        self.__name__ = name
        self._fn = self._load()

    def _load(self) -> Callable[..., Any]:
        if not self.path.is_file():
            raise FileNotFoundError(
                f"custom reward file {self.path} not found; set custom_reward_function.path to "
                "an existing Python file"
            )
        module = _load_module(self.path)
        fn = getattr(module, self.name, None)
        if not callable(fn):
            available = sorted(
                n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
            )
            raise AttributeError(
                f"custom reward file {self.path} has no function {self.name!r}; it defines "
                f"{available or 'no public functions'}. Set custom_reward_function.name to one "
                "of them."
            )
        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the loaded function with ``reward_kwargs`` added."""
        return self._fn(*args, **kwargs, **self.reward_kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (CustomRewardFn, (str(self.path), self.name, self.reward_kwargs))

    def __repr__(self) -> str:
        return f"CustomRewardFn({str(self.path)!r}, {self.name!r}, {self.reward_kwargs!r})"


def load_custom_reward_fn(
    path: str | Path, name: str = "compute_score", reward_kwargs: Mapping[str, Any] | None = None
) -> CustomRewardFn:
    """Return the function ``name`` of the Python file at ``path``, called with ``reward_kwargs``."""
    return CustomRewardFn(path, name, reward_kwargs)
