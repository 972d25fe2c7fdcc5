"""Values between the two sandboxes of an assertion suite: plain values as JSON, others as handles.

Runs in both sandboxes (``program_server.py`` and ``evaluator.py`` load it from ``/box``). Plain
values are None, bool, int, float, complex, str, bytes and lists, tuples, sets, frozensets and
dicts of them; anything else is sent as ``{"h": n}``, a handle the sender resolves. The
program's side encodes ``loose``ly (a subclass is sent as its base: a namedtuple as a tuple); the
evaluator's side trusts nothing it decodes.
"""


def encode(value, handle, loose=False, depth=0):
    if depth > 64:
        raise ValueError("value nested too deeply to send")

    def e(v):
        return encode(v, handle, loose, depth + 1)

    kind = type(value)
    if loose and kind not in (bool, int, float, str):
        bases: tuple[type, ...] = (bool, int, float, str, list, tuple, dict, frozenset, set, bytes)
        for base in bases:
            if isinstance(value, base):
                kind, value = base, base(value)
                break
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if abs(value) < float("inf") else {"f": repr(value)}
    if kind is complex:
        return {"c": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is list:
        return [e(v) for v in value]
    if kind is tuple:
        return {"t": [e(v) for v in value]}
    if kind is set:
        return {"s": [e(v) for v in value]}
    if kind is frozenset:
        return {"z": [e(v) for v in value]}
    if kind is dict:
        return {"d": [[e(k), e(v)] for k, v in value.items()]}
    return {"h": handle(value)}


def decode(data, remote, depth=0):
    if depth > 64:
        raise ValueError("value nested too deeply")

    def d(v):
        return decode(v, remote, depth + 1)

    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [d(v) for v in data]
    ((tag, body),) = data.items()
    if tag == "f":
        return float(str(body))
    if tag == "c":
        return complex(float(str(body[0])), float(str(body[1])))
    if tag == "b":
        return bytes.fromhex(str(body))
    if tag == "h":
        return remote(int(body))
    items = [d(v) for v in list(body)]
    if tag == "t":
        return tuple(items)
    if tag == "s":
        return set(items)
    if tag == "z":
        return frozenset(items)
    if tag == "d":
        return {k: v for k, v in items}
    raise ValueError("unknown value tag " + repr(tag))
