"""Interactions: what answers the policy's turn in a multi-turn rollout when no tool call does.

``actor_rollout_ref.rollout.multi_turn`` names them in one of two ways.

verl's interaction YAML, ``interaction_config_path``::

    interaction:
      - name: guess                             # optional: the class name, lower-case,
        class_name: my_interactions.GuessInteraction  # without "Interaction"
        config: {max_tries: 3}

``class_name`` is a dotted import path, imported as verl imports it; the YAML's own folder is
searched after the installed packages, so a class in a file next to the YAML needs no
``PYTHONPATH``. The class is built as ``cls(config={**config, "name": name})`` and used through
verl's ``BaseInteraction`` methods (async, as verl's are, or plain):

- ``start_interaction(instance_id, **interaction_kwargs)`` when a conversation starts;
- ``generate_response(instance_id, messages, **interaction_kwargs)`` after each assistant turn
  without a tool call, returning ``(should_terminate, response, score, metadata)``: ``response``
  becomes the next user message, unless ``should_terminate`` ends the conversation there (the
  response is then kept in the sample's ``turns`` but not appended to the sequence, as verl's
  SGLang rollout did); ``score`` (None for none) is that turn's score, collected per sample in
  ``turn_scores``, which the reward function reads as ``extra_info["turn_scores"]`` (verl's reward
  loop hands a reward function the rollout's ``turn_scores`` the same way; verl's own rewards,
  like ours, ignore them); ``metadata`` is not used, as in verl;
- ``finalize_interaction(instance_id)`` when the conversation ends.

``calculate_score`` is the class's own business: verl's loop does not call it either. A sample
picks its interaction by ``extra_info.interaction_kwargs.name`` (verl's field, from the dataset
row); those kwargs go to every call. A sample with no name gets the only interaction; with several
it is an error naming them. A class's calls of one turn run concurrently on one event loop (a
daemon thread), so an interaction that waits on a remote user simulator does not wait in line.

A plain function, ``interaction_path`` and ``interaction_name``, called in the rollout's thread::

    def interaction(messages: list[dict], extra_info: dict) -> dict | None:
        # the next user (or tool) message, or None to end the conversation

Failures: a YAML that cannot be read, a class that cannot be imported or built, raise at startup
naming the key and the class. At run time an interaction that raises or returns something else
than its contract says ends that conversation with a recorded interaction error (in ``turns``
and ``interaction_errors``, logged once per distinct message), as a failing tool call is
recorded; the run goes on.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import importlib
import importlib.util
import inspect
import logging
import math
import numbers
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

logger = logging.getLogger(__name__)

Interaction = Callable[[list[dict[str, Any]], dict[str, Any]], dict[str, Any] | None]
_KEY = "actor_rollout_ref.rollout.multi_turn"


# -- loading -------------------------------------------------------------------------------------
def load_interaction(path: str | Path, name: str) -> Interaction:
    """Return the function ``name`` defined in the Python file at ``path``."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(
            f"{_KEY}.interaction_path={str(path)!r} is not a file; point it at a Python file "
            "defining the interaction function"
        )
    module_name = "posttrain_interaction_" + hashlib.sha1(str(file).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"{_KEY}.interaction_path={str(file)!r} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ImportError(
            f"interaction file {file} failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        available = sorted(
            n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
        )
        raise AttributeError(
            f"interaction file {file} has no function {name!r}; it defines "
            f"{available or 'no public functions'}. Set {_KEY}.interaction_name to one of them."
        )
    return fn


def _import_class(class_name: Any, folder: Path, where: str) -> type:
    """Return the class at the dotted path ``class_name``; ImportError naming ``where``."""
    if not isinstance(class_name, str) or "." not in class_name.strip("."):
        raise ImportError(
            f"{where}.class_name={class_name!r} is not a dotted import path; write "
            "module.ClassName (e.g. my_interactions.GuessInteraction)"
        )
    module_name, attr = class_name.rsplit(".", 1)
    if str(folder) not in sys.path:
        sys.path.append(str(folder))  # after the installed packages: they win a name clash
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        hint = (
            "; verl's own interactions are not installed here: copy the class into a module "
            "next to the YAML"
            if module_name.split(".")[0] == "verl"
            else f"; put {module_name.replace('.', '/')}.py next to the YAML or install it"
        )
        raise ImportError(
            f"{where}.class_name={class_name!r} cannot be imported: "
            f"{type(exc).__name__}: {exc}{hint}"
        ) from exc
    cls = getattr(module, attr, None)
    if not inspect.isclass(cls):
        raise ImportError(
            f"{where}.class_name={class_name!r}: module {module_name} has no class {attr!r}"
        )
    if not callable(getattr(cls, "generate_response", None)):
        raise ImportError(
            f"{where}.class_name={class_name!r} has no generate_response(instance_id, messages, "
            "**kwargs); an interaction class implements verl's BaseInteraction methods"
        )
    return cls


def _default_name(class_name: str) -> str:
    """Return verl's name for an entry without one: the class name, lower-case, sans suffix."""
    simple = class_name.rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def load_interaction_config(path: str | Path) -> dict[str, Any]:
    """Return the interactions verl's YAML at ``path`` lists, built, keyed by name."""
    key = f"{_KEY}.interaction_config_path={str(path)!r}"
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(f"{key} is not a file; point it at an interaction YAML")
    try:
        spec = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{key} is not valid YAML: {exc}") from exc
    entries = spec.get("interaction") if isinstance(spec, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(
            f"{key} needs a non-empty list under 'interaction:' of {{name, class_name, config}}"
        )
    built: dict[str, Any] = {}
    for i, entry in enumerate(entries):
        where = f"{key}: interaction[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a mapping with class_name (and name, config)")
        cls = _import_class(entry.get("class_name"), file.parent, where)
        name = entry.get("name") or _default_name(entry["class_name"])
        if not isinstance(name, str):
            raise ValueError(f"{where}.name={name!r} must be a string")
        if name in built:
            raise ValueError(f"{where}: two interactions are named {name!r}; rename one")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ValueError(f"{where}.config must be a mapping")
        try:
            built[name] = cls(config={**config, "name": name})
        except Exception as exc:
            raise ImportError(
                f"{where}.class_name={entry['class_name']!r} could not be built with its config: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    return built


# -- one conversation's interaction, and the replies ---------------------------------------------
@dataclass
class Session:
    """The interaction one conversation talks to, and verl's ``interaction_kwargs`` for it."""

    name: str
    kwargs: dict[str, Any]
    extra_info: dict[str, Any]
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: bool = False


@dataclass
class Reply:
    """An interaction's answer to one assistant turn.

    ``message`` is the next message; ``ends`` says the conversation stops (then ``message``, if
    any, is only recorded). ``error`` is set when the interaction failed (then it ``ends``).
    """

    message: dict[str, Any] | None
    ends: bool
    score: float | None = None
    error: str | None = None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _score(value: Any) -> float | None:
    """Return a turn score as a float; ValueError for anything but None or a finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"its score must be a finite number or None, got {value!r}")
    return float(value)


def verl_reply(result: Any) -> Reply:
    """Return the :class:`Reply` of ``generate_response``'s ``(should_terminate, response,
    score, metadata)``; ValueError saying what is wrong with anything else."""
    if not isinstance(result, tuple | list) or len(result) != 4:
        raise ValueError(
            "generate_response must return (should_terminate, response, score, metadata), "
            f"got {result!r}"
        )
    terminate, response, score, _metadata = result
    if not isinstance(terminate, bool | np.bool_):
        raise ValueError(f"its should_terminate must be a bool, got {terminate!r}")
    if not isinstance(response, str):
        raise ValueError(f"its response must be a string, got {response!r}")
    return Reply({"role": "user", "content": response}, bool(terminate), _score(score))


def function_reply(message: Any) -> Reply:
    """Return the :class:`Reply` of a plain function's message (None ends the conversation)."""
    if message is None:
        return Reply(None, True)
    if not isinstance(message, dict) or "role" not in message or "content" not in message:
        raise ValueError(
            "the interaction must return a message dict with 'role' and 'content' or None, "
            f"got {message!r}"
        )
    return Reply(dict(message), False)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class Interactions:
    """The interactions a multi-turn rollout may talk to, by name, and the loop they run on."""

    def __init__(self, by_name: dict[str, Any], *, function: bool = False) -> None:
        """``by_name``: verl-style interaction objects, or one plain function (``function``)."""
        if not by_name:
            raise ValueError("Interactions needs at least one interaction")
        self.by_name = by_name
        self.function = function
        self._loop: asyncio.AbstractEventLoop | None = None
        self._logged: set[str] = set()

    @classmethod
    def from_function(cls, fn: Interaction) -> Interactions:
        """Return the interactions of one plain function ``fn(messages, extra_info)``."""
        return cls({getattr(fn, "__name__", "interaction"): fn}, function=True)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Interactions:
        """Return the interactions verl's YAML at ``path`` lists."""
        return cls(load_interaction_config(path))

    # -- choosing ----------------------------------------------------------------------------
    def session(self, extra_info: dict[str, Any]) -> Session:
        """Return a sample's session: its interaction by ``interaction_kwargs.name``."""
        kwargs = extra_info.get("interaction_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ValueError(
                f"extra_info.interaction_kwargs must be a mapping, got {kwargs!r} (row "
                f"{extra_info.get('index', '?')})"
            )
        names = sorted(self.by_name)
        name = kwargs.get("name")
        if name is None:
            if len(names) > 1 and not self.function:
                raise ValueError(
                    f"row {extra_info.get('index', '?')} names no interaction and "
                    f"{_KEY}.interaction_config_path lists {names}; set extra_info."
                    "interaction_kwargs.name to one of them"
                )
            name = names[0]
        elif self.function:
            name = names[0]  # one function answers every sample
        elif name not in self.by_name:
            raise ValueError(
                f"row {extra_info.get('index', '?')} asks for interaction {name!r} "
                f"(extra_info.interaction_kwargs.name); {_KEY}.interaction_config_path lists "
                f"{names}"
            )
        return Session(name, dict(kwargs), extra_info)

    # -- running -----------------------------------------------------------------------------
    def _run(self, coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
        """Run ``coros`` concurrently on the interactions' loop; exceptions come back as values."""
        if not coros:
            return []
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(
                target=self._loop.run_forever, name="interactions", daemon=True
            ).start()

        async def gather() -> list[Any]:
            return await asyncio.gather(*coros, return_exceptions=True)

        return asyncio.run_coroutine_threadsafe(gather(), self._loop).result()

    def _failed(self, session: Session, what: str, exc: BaseException, then: str) -> str:
        """Return the error of ``session``'s failed call ``what``, logged once per message."""
        error = f"interaction {session.name!r}: {what} failed: {_describe(exc)}"
        if self.function:  # one call, no verl method to name
            error = f"interaction {session.name!r} failed: {_describe(exc)}"
        if error not in self._logged:
            self._logged.add(error)
            logger.warning("%s; %s (recorded in the sample's interaction_errors)", error, then)
        return error

    async def _start(self, session: Session) -> None:
        method = getattr(self.by_name[session.name], "start_interaction", None)
        if method is not None:
            await _maybe_await(method(session.instance_id, **session.kwargs))

    def start(self, sessions: list[Session]) -> list[str | None]:
        """Start each session; return each one's error (None when it started)."""
        if self.function:  # a plain function keeps no state
            return [None] * len(sessions)
        outcomes = self._run([self._start(s) for s in sessions])
        errors: list[str | None] = []
        for session, outcome in zip(sessions, outcomes, strict=True):
            session.started = not isinstance(outcome, BaseException)
            errors.append(
                self._failed(session, "start_interaction", outcome, "no interaction for it")
                if isinstance(outcome, BaseException)
                else None
            )
        return errors

    async def _respond(self, session: Session, messages: list[dict[str, Any]]) -> Reply:
        target = self.by_name[session.name]
        result = await _maybe_await(
            target.generate_response(session.instance_id, messages, **session.kwargs)
        )
        return verl_reply(result)

    def _call_function(self, session: Session, messages: list[dict[str, Any]]) -> Any:
        """Return a plain function's reply, or the exception it raised (in this thread)."""
        try:
            return function_reply(self.by_name[session.name](messages, session.extra_info))
        except Exception as exc:
            return exc

    def respond(
        self, sessions: list[Session], conversations: list[list[dict[str, Any]]]
    ) -> list[Reply]:
        """Return each session's reply to its conversation (a copy is what the interaction sees)."""
        copies = [copy.deepcopy(c) for c in conversations]
        if self.function:
            outcomes = [self._call_function(s, c) for s, c in zip(sessions, copies, strict=True)]
        else:
            outcomes = self._run(
                [self._respond(s, c) for s, c in zip(sessions, copies, strict=True)]
            )
        replies = []
        for session, outcome in zip(sessions, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                error = self._failed(
                    session, "generate_response", outcome, "the conversation ends there"
                )
                outcome = Reply(None, True, error=error)
            replies.append(outcome)
        return replies

    async def _finish(self, session: Session) -> None:
        method = getattr(self.by_name[session.name], "finalize_interaction", None)
        if method is None:
            return
        try:  # verl's BaseInteraction.finalize_interaction(self) takes no instance id
            inspect.signature(method).bind(session.instance_id)
        except TypeError:
            await _maybe_await(method())
        else:
            await _maybe_await(method(session.instance_id))

    def finish(self, sessions: list[Session]) -> list[str | None]:
        """Finalize each started session; return each one's error (None when it went well)."""
        started = [s for s in sessions if s.started]
        outcomes = dict(
            zip(
                (s.instance_id for s in started),
                self._run([self._finish(s) for s in started]),
                strict=True,
            )
        )
        errors: list[str | None] = []
        for session in sessions:
            outcome = outcomes.get(session.instance_id)
            session.started = False
            errors.append(
                self._failed(session, "finalize_interaction", outcome, "its state may linger")
                if isinstance(outcome, BaseException)
                else None
            )
        return errors
