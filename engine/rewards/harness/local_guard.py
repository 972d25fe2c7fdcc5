"""The ``POSTTRAIN_SANDBOX=local`` harness: a guarded process for a candidate or a harness program.

Started as ``python -I -c <this text>`` in a temporary working folder. It installs an audit hook
(PEP 578) that refuses writes outside the working folder (``/dev/null`` aside), new processes,
signals, sockets and ``ctypes``, then:

- with a script named after the text (``python -I -c <this text> /folder/server.py ARGS``): runs
  that harness program as ``__main__`` under the guard (an assertion suite's program side or
  evaluator, each in its own process, as in the bubblewrap sandboxes);
- without one: reads one JSON payload on stdin (the nonce, the code, the inputs), runs the
  candidate once per input with that input as stdin, and reports one line per input on its real
  stdout: the nonce then ``[index, captured output, error]``.

The candidate shares the interpreter with this guard, so it can reach all of it: it is a guard
against accidents, not a security boundary.
"""

import io
import json
import os
import runpy
import sys


def _install_guard(workdir):
    root = os.path.realpath(workdir)
    realpath, join, fsdecode = os.path.realpath, os.path.join, os.fsdecode
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    path_args = {
        "os.remove": (0,),
        "os.rmdir": (0,),
        "os.mkdir": (0,),
        "os.rename": (0, 1),
        "os.link": (0, 1),
        "os.symlink": (1,),
        "os.chmod": (0,),
        "os.chown": (0,),
        "os.chflags": (0,),
        "os.truncate": (0,),
        "os.utime": (0,),
        "os.mkfifo": (0,),
        "os.mknod": (0,),
        "shutil.rmtree": (0,),
        "shutil.chown": (0,),
    }
    refused = (
        "subprocess.",
        "os.system",
        "os.exec",
        "os.spawn",
        "os.posix_spawn",
        "os.fork",
        "os.forkpty",
        "pty.",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "socket.",
        "ctypes.",
        "webbrowser.",
    )

    def inside(path):
        if isinstance(path, int):
            return True
        resolved = realpath(join(root, fsdecode(path)))
        return resolved == root or resolved.startswith(root + os.sep)

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags
            )
            if writes and path is not None and path != os.devnull and not inside(path):
                raise PermissionError(f"writing {path!r} outside the sandbox is not allowed")
        elif event in path_args:
            for i in path_args[event]:
                if i < len(args) and args[i] is not None and not inside(args[i]):
                    raise PermissionError(
                        f"{event} on {args[i]!r} outside the sandbox is not allowed"
                    )
        elif event.startswith(refused) or (event == "import" and args[0] in ("ctypes", "_ctypes")):
            raise PermissionError(f"{event} is not allowed in the sandbox")

    sys.addaudithook(hook)


def _run_stdio():
    payload = json.loads(sys.stdin.read())
    nonce = payload["nonce"]
    report = sys.stdout
    code = compile(payload["code"], "<candidate>", "exec")

    def text_stream(text=""):
        return io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8", write_through=True)

    def describe(exc):
        text = str(exc)
        return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:500]

    _install_guard(os.getcwd())
    for index, text in enumerate(payload["inputs"]):
        sys.stdin, sys.stdout = text_stream(text), text_stream()
        captured, error = sys.stdout, None
        try:
            exec(code, {"__name__": "__main__"})
        except SystemExit:
            pass
        except BaseException as exc:
            error = describe(exc)
        sys.stdout = report
        try:
            output = captured.buffer.getvalue().decode("utf-8", "replace")
        except Exception as exc:
            output, error = "", error or describe(exc)
        report.write(nonce + " " + json.dumps([index, output, error]) + "\n")
        report.flush()


if len(sys.argv) > 1:
    _install_guard(os.getcwd())
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    _run_stdio()
