"""The evaluator's side of an assertion suite: run the tests against the program's values.

Started as ``evaluator.py REQUEST_FD`` (``/box`` in a sandbox, a folder of its own under the
local guard) with the tests beside it in ``tests.json`` (the nonce, the statements, the reply
size limit); stdin carries the program's replies, ``REQUEST_FD`` the requests to it. It never
runs candidate code: the program's top-level names are bound to ``Remote`` proxies whose calls
and attributes come back as plain values or further proxies, and a proxy has no truth value. An
exception the program raised is raised here by its builtin name, except those that end an
iteration: only the end of one of the program's iterators raises ``StopIteration``, so the
program can never end the tests' own ``map``, ``filter``, ``zip`` or generator. Each ``assert``
is reported on the real stdout as one line, the nonce then ``[index, passed, error]``;
statements' own output goes to ``/dev/null``.
"""

import builtins
import json
import os
import sys

# Where this program was started from: /box in a sandbox, a folder under the local guard.
BOX = os.path.dirname(os.path.abspath(__file__))
codec: dict = {}  # the names codec.py defines
with open(os.path.join(BOX, "codec.py"), encoding="utf-8") as f:
    exec(compile(f.read(), "codec.py", "exec"), codec)
encode, decode = codec["encode"], codec["decode"]

with open(os.path.join(BOX, "tests.json"), encoding="utf-8") as f:
    payload = json.load(f)
report = os.fdopen(os.dup(1), "w")
null = os.open("/dev/null", os.O_RDWR)
os.dup2(null, 1)
replies, requests = os.fdopen(0, "rb"), os.fdopen(int(sys.argv[1]), "wb")
limit = payload["max_reply_bytes"]
PLAIN = "plain values (None, bool, numbers, str, bytes, list, tuple, dict, set)"
ENDS_LOOPS = (StopIteration, StopAsyncIteration)


class ProgramGone(Exception):
    pass


def receive():
    line = replies.readline(limit + 1)
    if not line.endswith(b"\n"):
        raise ProgramGone(f"the program ended, or sent a value over {limit} bytes")
    return json.loads(line)


def rpc(op, **fields):
    try:
        requests.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        requests.flush()
    except OSError:
        raise ProgramGone("the program ended") from None
    message = receive()
    if "ok" in message:
        return decode(message["ok"], Remote)
    name, text = message["err"]
    if op == "next" and name == "StopIteration":
        raise StopIteration  # one of the program's iterators ended
    kind = getattr(builtins, str(name), None)
    # Anywhere else an exception that ends an iteration would end the test's own loop (a
    # function raising StopIteration inside all(map(...)) would make it vacuously true): it is
    # reported like a BaseException, as a RuntimeError naming it (as PEP 479 does in generators).
    if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, ENDS_LOOPS):
        try:
            error = kind(str(text))
        except Exception:
            error = None
        if error is not None:
            raise error
    raise RuntimeError(f"{name}: {text}")


def send(value):
    def handle(v):
        if isinstance(v, Remote):
            return object.__getattribute__(v, "_id")
        raise TypeError(f"a test can pass the program only {PLAIN}, not {type(v).__name__}")

    return encode(value, handle)


class Remote:
    __slots__ = ("_id",)

    def __init__(self, ident):
        object.__setattr__(self, "_id", ident)

    def __call__(self, *args, **kwargs):
        return rpc(
            "call",
            h=self._id,
            args=[send(a) for a in args],
            kw={k: send(v) for k, v in kwargs.items()},
        )

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return rpc("getattr", h=self._id, name=name)

    def __iter__(self):
        return rpc("iter", h=self._id)

    def __next__(self):
        return rpc("next", h=self._id)

    def __len__(self):
        return rpc("len", h=self._id)

    def __getitem__(self, key):
        return rpc("getitem", h=self._id, key=send(key))

    def __contains__(self, item):
        return rpc("contains", h=self._id, item=send(item))

    def __repr__(self):
        return str(rpc("repr", h=self._id))

    def __bool__(self):
        raise TypeError("a test judges only " + PLAIN + "; the program returned another object")


try:
    first = receive()
    names = set(first["names"]) if "names" in first else set()
    setup_error = None if "names" in first else "{}: {}".format(*first["err"])
except Exception as exc:
    names, setup_error = set(), f"the program exited before its tests ran ({exc})"


class Namespace(dict):
    def __missing__(self, name):
        if name in names:
            try:
                return rpc("global", name=name)
            except KeyError:
                pass
        raise KeyError(name)


namespace = Namespace(__name__="__main__", __builtins__=builtins)
index = 0
for source, is_test in payload["statements"]:
    error = setup_error
    if error is None:
        try:
            exec(compile(source, "<tests>", "exec"), namespace)
        except ProgramGone as exc:
            error = setup_error = str(exc)
        except BaseException as exc:
            text = str(exc)
            error = (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:500]
    if is_test:
        report.write(payload["nonce"] + " " + json.dumps([index, error is None, error]) + "\n")
        report.flush()
        index += 1
