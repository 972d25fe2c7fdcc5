"""Functions registered by name, and the registered names read from the source without importing it.

verl's ``core_algos`` registers advantage estimators (``register_adv_est``) and policy losses
(``register_policy_loss``) by name with a decorator; so does this package, with one
:class:`Registry` for both. The config offers the registered names as its choices, and it loads
without torch (the web app checks configs), so it cannot import the functions to learn their
names. A name is therefore written once, as the string literal of the decorator beside its
function, and :func:`registered_names` reads those literals from the source files with ``ast``,
importing nothing: ``engine.algorithms.names`` keeps the lists it reads. A registration whose name
the list lacks (made somewhere else, or under a name that is not a literal) is refused, since
the config would refuse that name.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def registered_names(path: Path, decorator: str) -> tuple[str, ...]:
    """Return the names that ``@decorator("name")`` gives the top-level functions of ``path``.

    ``path`` is a module, or a package whose modules are read in the order of their file names;
    names come in source order. ValueError names the file and line of a decorator whose name is
    not a string literal.
    """
    files = sorted(path.glob("*.py")) if path.is_dir() else [path]
    names = []
    for file in files:
        for node in ast.parse(file.read_text(encoding="utf-8"), str(file)).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for call in node.decorator_list:
                if not (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id == decorator
                ):
                    continue
                name = call.args[0] if len(call.args) == 1 else None
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                    raise ValueError(
                        f"{file}:{call.lineno}: give @{decorator} the name as one string "
                        "literal, so the config can read it without importing the module."
                    )
                names.append(name.value)
    return tuple(names)


class Registry(dict[str, F], Generic[F]):
    """Functions by name; only a name of ``names`` (the config's choices) may be registered.

    ``kind`` and ``plural`` word the errors ("advantage estimator", "names"); ``listed_as`` is
    the name of ``names`` in ``engine.algorithms.names`` and ``source`` the file or folder of
    ``engine/algorithms`` it is read from.
    """

    def __init__(
        self, names: tuple[str, ...], kind: str, plural: str, listed_as: str, source: str
    ) -> None:
        super().__init__()
        self.names = names
        self.kind = kind
        self.plural = plural
        self.listed_as = f"engine.algorithms.names.{listed_as}"
        self.source = f"engine/algorithms/{source}"

    def register(self, name: str) -> Callable[[F], F]:
        """Return a decorator that registers a function under ``name``."""
        name = str(name)  # verl's AdvantageEstimator members are str enums
        if name not in self.names:
            raise ValueError(
                f"{self.kind.capitalize()} {name!r} is not listed; add it to {self.listed_as} by "
                f"registering it in {self.source}, where that list is read from, so the config "
                "accepts it."
            )

        def decorator(fn: F) -> F:
            if self.get(name, fn) is not fn:
                raise ValueError(
                    f"{self.kind.capitalize()} {name!r} is already registered "
                    f"({self[name].__name__}); pick another name."
                )
            self[name] = fn
            return fn

        return decorator

    def lookup(self, name: str) -> F:
        """Return the function registered as ``name``; ValueError lists the registered names."""
        if name not in self:
            raise ValueError(
                f"Unknown {self.kind} {name!r}; valid {self.plural} are: {', '.join(sorted(self))}."
            )
        return self[name]
