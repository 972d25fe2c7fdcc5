"""Interactions: what answers the policy's turn in a multi-turn rollout when no tool call does.

``actor_rollout_ref.rollout.multi_turn`` names them in one of two ways.

verl's interaction YAML, ``interaction_config_path``::

    interaction:
      - name: guess                             # optional: the class name, lower-case,
        class_name: my_interactions.GuessInteraction  # without "Interaction"
        config: {max_tries: 3, timeout_s: 30}     # timeout_s: see below

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
it is an error naming them. The calls of one turn run concurrently: async methods on one event
loop (a daemon thread), so an interaction that waits on a remote user simulator does not wait in
line; plain methods each in a daemon thread of their own, so one that blocks holds up no other.

A plain function, ``interaction_path`` and ``interaction_name``, called in a thread per sample::

    def interaction(messages: list[dict], extra_info: dict) -> dict | None:
        # the next user (or tool) message, or None to end the conversation

Every call is time-limited: an entry's ``config.timeout_s`` (seconds > 0, checked at startup;
the class sees it in its config too), by default the tools' ``DEFAULT_TIMEOUT_S``; a plain
function gets the default. Async methods run under ``asyncio.wait_for``, plain ones are waited
for until their limit. An async method that blocks the loop itself (``time.sleep`` in an
``async def``) cannot be interrupted: once the loop has been stuck past the turn's largest limit
and :data:`LOOP_GRACE_S`, that turn's pending calls time out, the loop is abandoned (its daemon
thread ends when the blocking call returns, if ever) and the next calls get a new one. Python
stops neither a thread nor a coroutine that does not await, so a call past its limit is left to
finish on its own and what it returns is dropped, as for a timed-out tool call.

Failures: a YAML that cannot be read, a class that cannot be imported or built, raise at startup
naming the key and the class (a bad ``timeout_s`` names the entry). At run time an interaction
that raises, runs past its limit or returns something else than its contract says ends that
conversation with a recorded interaction error (in ``turns`` and ``interaction_errors``, logged
once per distinct message), as a failing tool call is recorded; the run goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import importlib
import importlib.util
import inspect
import logging
import math
import numbers
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from engine.python_files import NotPythonModule, exec_python_file
from engine.tools.base import DEFAULT_TIMEOUT_S

logger = logging.getLogger(__name__)

Interaction = Callable[[list[dict[str, Any]], dict[str, Any]], dict[str, Any] | None]
Call = Callable[[], Any]  # one interaction call, its arguments bound
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
    try:
        module = exec_python_file(file, "posttrain_interaction")
    except NotPythonModule:
        raise ImportError(
            f"{_KEY}.interaction_path={str(file)!r} cannot be loaded as Python"
        ) from None
    except Exception as exc:
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
    return _load_interaction_yaml(path)[0]


def _timeout_s(config: dict[str, Any], where: str, name: str) -> float:
    """Return the entry's ``config.timeout_s`` (the tools' default when unset), checked."""
    timeout = config.get("timeout_s", DEFAULT_TIMEOUT_S)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(
            f"{where}.config.timeout_s={timeout!r}: interaction {name!r} needs seconds > 0 "
            f"(how long one of its calls may take; default {DEFAULT_TIMEOUT_S:g})"
        )
    return float(timeout)


def _load_interaction_yaml(path: str | Path) -> tuple[dict[str, Any], dict[str, float]]:
    """Return the interactions verl's YAML at ``path`` lists, built, and their time limits."""
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
    timeouts: dict[str, float] = {}
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
        timeouts[name] = _timeout_s(config, where, name)
        try:
            built[name] = cls(config={**config, "name": name})
        except Exception as exc:
            raise ImportError(
                f"{where}.class_name={entry['class_name']!r} could not be built with its config: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    return built, timeouts


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


# -- running calls within their limits -----------------------------------------------------------
LOOP_GRACE_S = 1.0  # how long past the largest limit a loop may take before it counts as blocked
_PENDING = object()  # a call's outcome before it returns


class InteractionTimeout(Exception):
    """A call that ran past its interaction's ``timeout_s``; the message is the recorded error."""


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _call_in_thread(
    call: Call, outcomes: list[Any], i: int, loop: asyncio.AbstractEventLoop
) -> None:
    """Run a plain call (in its own thread); put its result or exception in ``outcomes[i]``."""
    try:
        result = call()
        if inspect.isawaitable(result):  # a plain method that hands back a coroutine
            result = asyncio.run_coroutine_threadsafe(_await(result), loop).result()
        outcomes[i] = result
    except BaseException as exc:  # the call's failure, recorded, whatever it is
        outcomes[i] = exc


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """Run ``loop`` until it is stopped (only an abandoned loop is), then close it."""
    loop.run_forever()
    loop.close()


async def _wind_down() -> None:
    """Cancel what is left on an abandoned loop, then stop it (once the blocking call returns)."""
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    asyncio.get_running_loop().stop()


class Interactions:
    """The interactions a multi-turn rollout may talk to, by name, and how their calls run."""

    def __init__(
        self,
        by_name: dict[str, Any],
        *,
        function: bool = False,
        timeouts: dict[str, float] | None = None,
        source: str | None = None,
    ) -> None:
        """``by_name``: verl-style interaction objects, or one plain function (``function``).

        ``timeouts``: the seconds each interaction's calls may take, by name (default
        :data:`engine.tools.base.DEFAULT_TIMEOUT_S`, as for tools); ``source``: the YAML they
        come from, which a timeout error names.
        """
        if not by_name:
            raise ValueError("Interactions needs at least one interaction")
        self.by_name = by_name
        self.function = function
        self.timeouts = {name: (timeouts or {}).get(name, DEFAULT_TIMEOUT_S) for name in by_name}
        self.source = source
        self._loop: asyncio.AbstractEventLoop | None = None
        self._logged: set[str] = set()

    @classmethod
    def from_function(cls, fn: Interaction) -> Interactions:
        """Return the interactions of one plain function ``fn(messages, extra_info)``."""
        return cls({getattr(fn, "__name__", "interaction"): fn}, function=True)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Interactions:
        """Return the interactions verl's YAML at ``path`` lists, with their time limits."""
        built, timeouts = _load_interaction_yaml(path)
        return cls(built, timeouts=timeouts, source=str(path))

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
    def _run(self, what: str, calls: list[tuple[Session, Call | None]]) -> list[Any]:
        """Run ``calls`` at once, each within its interaction's limit; return each one's result
        or the exception it raised (:class:`InteractionTimeout` past its limit; None for a
        session with no call).

        Async methods run on the interactions' loop under ``asyncio.wait_for``; everything else
        in a daemon thread per call, so a blocking call holds up no other. A call past its limit
        is abandoned, not stopped (Python can stop neither a thread nor a coroutine that does not
        await); what it returns later is not recorded.
        """
        if not calls:
            return []
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(
                target=_serve, args=(self._loop,), name="interactions", daemon=True
            ).start()
        loop = self._loop
        outcomes: list[Any] = [None if call is None else _PENDING for _, call in calls]
        started = time.monotonic()
        threads: list[tuple[int, threading.Thread, float]] = []
        on_loop: list[tuple[int, Call, float]] = []
        for i, (session, call) in enumerate(calls):
            limit = self.timeouts[session.name]
            if call is None:
                continue
            if inspect.iscoroutinefunction(call):
                on_loop.append((i, call, limit))
                continue
            thread = threading.Thread(
                target=_call_in_thread,
                args=(call, outcomes, i, loop),
                name=f"interaction-{session.name}",
                daemon=True,
            )
            thread.start()
            threads.append((i, thread, limit))
        future = self._start_on_loop(loop, on_loop, outcomes) if on_loop else None
        late: set[int] = set()
        for i, thread, limit in threads:  # the loop's calls go on meanwhile
            thread.join(max(0.0, limit - (time.monotonic() - started)))
            if thread.is_alive():
                late.add(i)
        blocked = False
        if future is not None:  # a healthy loop is done by the largest limit: wait_for's
            deadline = max(limit for _, _, limit in on_loop) + LOOP_GRACE_S
            try:
                future.result(timeout=max(0.0, deadline - (time.monotonic() - started)))
            except TimeoutError:  # an async method blocks the loop itself: leave it behind
                self._abandon(loop, deadline)
                blocked = True
        done = list(outcomes)  # a late call's result is not recorded
        looped = {i for i, _, _ in on_loop}
        return [
            self._timed_out(session, what, blocked and i in looped)
            if outcome is _PENDING or i in late
            else outcome
            for i, ((session, _), outcome) in enumerate(zip(calls, done, strict=True))
        ]

    @staticmethod
    def _start_on_loop(
        loop: asyncio.AbstractEventLoop,
        calls: list[tuple[int, Call, float]],
        outcomes: list[Any],
    ) -> concurrent.futures.Future[None]:
        """Start the async ``calls`` on ``loop``, each under ``asyncio.wait_for``, each putting
        its result or exception in ``outcomes``; return the future of them all."""

        async def one(i: int, call: Call, limit: float) -> None:
            async def guarded() -> Any:
                try:
                    return await call()
                except Exception as exc:  # the call's failure; only wait_for's timeout escapes
                    return exc

            with contextlib.suppress(TimeoutError):  # left pending: recorded as a timeout
                outcomes[i] = await asyncio.wait_for(guarded(), limit)

        async def gather() -> None:
            await asyncio.gather(*(one(*call) for call in calls))

        return asyncio.run_coroutine_threadsafe(gather(), loop)

    def _abandon(self, loop: asyncio.AbstractEventLoop, waited: float) -> None:
        """Leave the blocked ``loop`` behind (its thread ends once the call returns, if ever)."""
        if self._loop is loop:
            self._loop = None  # the next calls start a new one
        asyncio.run_coroutine_threadsafe(_wind_down(), loop)
        message = (
            "an async interaction method blocked the interactions' event loop (it sleeps or "
            "computes without awaiting); the pending calls were recorded as timed out after "
            "%g s, the next calls run on a new loop and the blocked one's thread is left behind "
            "until the call returns. Make the method await (asyncio.sleep, an async client) or "
            "make it a plain method, which runs in a thread of its own"
        )
        if message not in self._logged:
            self._logged.add(message)
            logger.warning(message, waited)

    def _timed_out(self, session: Session, what: str, blocked: bool) -> InteractionTimeout:
        """Return the error of ``session``'s call ``what`` that ran past its limit."""
        limit = self.timeouts[session.name]
        if self.function:
            return InteractionTimeout(
                f"interaction {session.name!r} timed out after {limit:g} s; make it return "
                f"sooner (a function from {_KEY}.interaction_path has the default limit; an "
                f"entry of {_KEY}.interaction_config_path sets its own config.timeout_s)"
            )
        why = (
            " while the interactions' event loop was blocked (an async method that sleeps or "
            "computes without awaiting holds up every async call)"
            if blocked
            else ""
        )
        return InteractionTimeout(
            f"interaction {session.name!r}: {what} timed out after {limit:g} s{why}; raise its "
            f"config.timeout_s in {self.source or 'the interaction YAML'} or make it return "
            "sooner"
        )

    def _failed(self, session: Session, what: str, exc: BaseException, then: str) -> str:
        """Return the error of ``session``'s failed call ``what``, logged once per message."""
        if isinstance(exc, InteractionTimeout):
            error = str(exc)
        elif self.function:  # one call, no verl method to name
            error = f"interaction {session.name!r} failed: {_describe(exc)}"
        else:
            error = f"interaction {session.name!r}: {what} failed: {_describe(exc)}"
        if error not in self._logged:
            self._logged.add(error)
            logger.warning("%s; %s (recorded in the sample's interaction_errors)", error, then)
        return error

    def _method(self, session: Session, what: str, /, *args: Any, **kwargs: Any) -> Call | None:
        """Return the call of ``session``'s interaction method ``what``, None without one."""
        method = getattr(self.by_name[session.name], what, None)
        return None if method is None else partial(method, *args, **kwargs)

    def start(self, sessions: list[Session]) -> list[str | None]:
        """Start each session; return each one's error (None when it started)."""
        if self.function:  # a plain function keeps no state
            return [None] * len(sessions)
        calls = [
            (s, self._method(s, "start_interaction", s.instance_id, **s.kwargs)) for s in sessions
        ]
        errors: list[str | None] = []
        for session, outcome in zip(sessions, self._run("start_interaction", calls), strict=True):
            session.started = not isinstance(outcome, BaseException)
            errors.append(
                self._failed(session, "start_interaction", outcome, "no interaction for it")
                if isinstance(outcome, BaseException)
                else None
            )
        return errors

    def respond(
        self, sessions: list[Session], conversations: list[list[dict[str, Any]]]
    ) -> list[Reply]:
        """Return each session's reply to its conversation (a copy is what the interaction sees)."""
        copies = [copy.deepcopy(c) for c in conversations]
        pairs = list(zip(sessions, copies, strict=True))
        reply: Callable[[Any], Reply] = function_reply if self.function else verl_reply
        calls: list[tuple[Session, Call | None]] = [
            (s, partial(self.by_name[s.name], c, s.extra_info))
            if self.function
            else (s, partial(self.by_name[s.name].generate_response, s.instance_id, c, **s.kwargs))
            for s, c in pairs
        ]
        replies = []
        for session, outcome in zip(sessions, self._run("generate_response", calls), strict=True):
            if not isinstance(outcome, BaseException):
                try:
                    outcome = reply(outcome)
                except ValueError as exc:
                    outcome = exc
            if isinstance(outcome, BaseException):
                error = self._failed(
                    session, "generate_response", outcome, "the conversation ends there"
                )
                outcome = Reply(None, True, error=error)
            replies.append(outcome)
        return replies

    def _finalizer(self, session: Session) -> Call | None:
        """Return the call of ``session``'s ``finalize_interaction``, None without one."""
        method = getattr(self.by_name[session.name], "finalize_interaction", None)
        if method is None:
            return None
        try:  # verl's BaseInteraction.finalize_interaction(self) takes no instance id
            inspect.signature(method).bind(session.instance_id)
        except TypeError:
            return partial(method)
        return partial(method, session.instance_id)

    def finish(self, sessions: list[Session]) -> list[str | None]:
        """Finalize each started session; return each one's error (None when it went well)."""
        started = [s for s in sessions if s.started]
        calls = [(s, self._finalizer(s)) for s in started]
        outcomes = dict(
            zip(
                (s.instance_id for s in started),
                self._run("finalize_interaction", calls),
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
