"""The program's side of an assertion suite: run the candidate, then answer with values.

Started as ``server.py`` (``/box`` in a sandbox, a folder of its own under the local guard) with
the candidate beside it in ``main.py``; stdin carries the evaluator's requests and stdout the
replies, one JSON line each. The candidate's own stdin and stdout are ``/dev/null``. The first
reply is the candidate's top-level names (or the error that stopped it); each later one is
``{"ok": value}`` or ``{"err": [exception name, message]}``. Everything here is the candidate's
to tamper with: the evaluator trusts only the values.
"""

import builtins
import json
import os

# Where this program was started from: /box in a sandbox, a folder under the local guard.
BOX = os.path.dirname(os.path.abspath(__file__))
codec: dict = {}  # the names codec.py defines
with open(os.path.join(BOX, "codec.py"), encoding="utf-8") as f:
    exec(compile(f.read(), "codec.py", "exec"), codec)
encode, decode = codec["encode"], codec["decode"]

requests, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
null = os.open("/dev/null", os.O_RDWR)
os.dup2(null, 0)
os.dup2(null, 1)
objects: list = []  # what handles name, by index


def handle(value):
    objects.append(value)
    return len(objects) - 1


def reply(message):
    replies.write(json.dumps(message).encode() + b"\n")
    replies.flush()


def failure(exc):
    return {"err": [type(exc).__name__, str(exc)[:500]]}


namespace = {"__name__": "__main__", "__builtins__": builtins}
try:
    with open(os.path.join(BOX, "main.py"), encoding="utf-8") as f:
        exec(compile(f.read(), "<candidate>", "exec"), namespace)
except SystemExit:
    pass
except BaseException as exc:
    reply(failure(exc))
    os._exit(0)
reply({"names": [name for name in namespace if not name.startswith("__")]})


def arg(value):
    return decode(value, objects.__getitem__)


ops = {
    "global": lambda r: namespace[r["name"]],
    "call": lambda r: objects[r["h"]](
        *map(arg, r["args"]), **{k: arg(v) for k, v in r["kw"].items()}
    ),
    "getattr": lambda r: getattr(objects[r["h"]], r["name"]),
    "iter": lambda r: iter(objects[r["h"]]),
    "next": lambda r: next(objects[r["h"]]),
    "len": lambda r: len(objects[r["h"]]),
    "getitem": lambda r: objects[r["h"]][arg(r["key"])],
    "contains": lambda r: arg(r["item"]) in objects[r["h"]],
    "repr": lambda r: repr(objects[r["h"]]),
}
for line in requests:
    try:
        request = json.loads(line)
        message = {"ok": encode(ops[request["op"]](request), handle, loose=True)}
    except BaseException as exc:
        message = failure(exc)
    reply(message)
