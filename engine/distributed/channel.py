"""A direct connection from the controller to each rank for the calls to the rank's roles.

Ray starts and places the ranks, joins them in the process group and kills them. The calls to
the roles (building them, and every step's rollout, log-probs, values and updates, state dicts,
exports) go over a TCP connection of their own between the controller and each rank. On the
2-core machine of ``docs/benchmarks.md`` a Ray actor call and its reply took 2.2 ms for 15 KB
when both sides had been idle for 20 ms, as every call of a training step starts, and 0.1 ms
over a socket; a tiny CPU step of about 55 ms makes two such calls. Ray's compiled graphs cut
that latency too, but an idle actor of a compiled graph spins on a core; an idle rank here
sleeps in ``recv``.

The wire is a length-prefixed frame holding a pickled ``(method, args, kwargs)`` request or an
``(ok, value)`` reply (:func:`pack`). The rank serves its connection on a thread of its own, and
every role call of the run arrives there, so the roles (vLLM, CUDA streams, thread-local torch
state) always see that one thread. A rank that raises sends the exception back and the
controller raises it with the rank's traceback as a note. A rank process that dies closes its
socket, and the controller raises :class:`RankChannelError` naming it, without waiting for the
other ranks (which may be waiting for it in a collective); a rank whose collective failed because
a peer died reports that death instead (both arrive at once, in either order). A node that
vanishes without closing is noticed by TCP keepalive within about a minute.

Set ``POSTTRAIN_RANK_CHANNEL=0`` to send these calls as Ray actor calls instead, for a cluster
whose nodes cannot open connections to each other's free ports.
"""

from __future__ import annotations

import hmac
import os
import pickle
import selectors
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

HEADER = struct.Struct("!Q")
TOKEN_BYTES = 32
CONNECT_TIMEOUT_S = 30.0
# A payload this small is sent with its header in one write.
SMALL_FRAME = 1 << 20
ENV_SWITCH = "POSTTRAIN_RANK_CHANNEL"
# After a rank's error, how long to look for a peer whose death caused it (see _lost_peer).
PEER_LOSS_GRACE_S = 2.0


def enabled() -> bool:
    """Return whether calls to the ranks' roles go over the direct channel
    (``POSTTRAIN_RANK_CHANNEL``)."""
    value = os.environ.get(ENV_SWITCH, "1").strip().lower()
    if value not in ("0", "1", "false", "true", "no", "yes", "off", "on"):
        raise ValueError(f"{ENV_SWITCH}={value!r}: use 1 (the default) or 0")
    return value in ("1", "true", "yes", "on")


class RankChannelError(RuntimeError):
    """A rank's connection closed or failed: the rank process died or its node went away.

    ``rank`` is the rank whose connection was lost (None when no connection was made).
    """

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


def pack(value: Any) -> bytes:
    """Pickle a request or reply into one bytes object, the arrays' buffers in band.

    Ray ships each numpy array of a pickled ``DataProto`` as a buffer of its own; for a batch of
    a dozen columns that costs more than the same batch as one bytes object, so calls travel
    packed through Ray too when the channel is off.
    """
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(payload: bytes | bytearray) -> Any:
    """Return what :func:`pack` pickled."""
    return pickle.loads(payload)


def send_frame(sock: socket.socket, payload: bytes) -> None:
    """Write one length-prefixed frame."""
    header = HEADER.pack(len(payload))
    if len(payload) < SMALL_FRAME:
        sock.sendall(header + payload)
    else:
        sock.sendall(header)
        sock.sendall(payload)


def recv_frame(sock: socket.socket) -> bytearray:
    """Read one length-prefixed frame; ConnectionError if the peer closed the connection."""
    (size,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    return _recv_exact(sock, size)


def _recv_exact(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = 0
    while received < size:
        count = sock.recv_into(view[received:])
        if count == 0:
            raise ConnectionError("the peer closed the connection")
        received += count
    return buffer


def _tune(sock: socket.socket) -> None:
    """No Nagle delay on small frames; keepalive probes to notice a vanished peer in ~1 min."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def reply_for(call: Callable[[], Any]) -> bytes:
    """Run ``call`` and return the packed ``(True, result)``, or ``(False, (error, traceback))``."""
    try:
        return pack((True, call()))
    except Exception as exc:  # noqa: BLE001 (any error goes back to the controller)
        trace = traceback.format_exc()
        try:
            reply = pack((False, (exc, trace)))
            unpack(reply)  # an exception class whose __init__ takes other arguments fails here
            return reply
        except Exception:  # noqa: BLE001 (an exception that does not pickle and unpickle)
            return pack((False, (RuntimeError(f"{type(exc).__name__}: {exc}"), trace)))


def result_of(reply: bytes | bytearray, rank: int, pid: int) -> Any:
    """Return the result in a :func:`reply_for` reply, or raise the rank's exception with its
    traceback as a note."""
    ok, value = unpack(reply)
    if ok:
        return value
    error, trace = value
    error.add_note(f"raised on rank {rank} (pid {pid}):\n{trace}")
    raise error


class ChannelServer:
    """The rank's end: accepts the controller's connection and answers its frames on a thread.

    ``handler`` turns a request frame into a reply frame (see :func:`reply_for`).
    """

    def __init__(self, handler: Callable[[bytearray], bytes], host: str) -> None:
        self.handler = handler
        self.token = os.urandom(TOKEN_BYTES)
        self.listener = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, self.listener.getsockname()[1])
        self.thread = threading.Thread(target=self._serve, name="rank-channel", daemon=True)
        self.thread.start()

    def _accept(self) -> socket.socket | None:
        """Return the controller's connection: the first one that presents the token."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed before the controller connected
                return None
            try:
                conn.settimeout(CONNECT_TIMEOUT_S)
                if hmac.compare_digest(_recv_exact(conn, TOKEN_BYTES), self.token):
                    conn.settimeout(None)
                    return conn
            except (OSError, ConnectionError):
                pass
            conn.close()

    def _serve(self) -> None:
        conn = self._accept()
        self.listener.close()
        if conn is None:
            return
        _tune(conn)
        with conn:
            while True:
                try:
                    request = recv_frame(conn)
                except (ConnectionError, OSError):
                    return  # the controller left
                send_frame(conn, self.handler(request))

    def close(self) -> None:
        """Stop accepting (a connected controller's socket closes from its side)."""
        self.listener.close()


class RankChannels:
    """The controller's end: one connection per rank, in rank order."""

    def __init__(self, endpoints: Sequence[tuple[str, int, bytes]], pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.sockets: list[socket.socket] = []
        # Replies a rank still owes: a call that raised on one rank leaves the others' unread.
        self.owed = [0] * len(endpoints)
        # Set once a rank's connection was lost: the others may wait on it in a collective.
        self.broken = False
        try:
            for rank, (host, port, token) in enumerate(endpoints):
                try:
                    sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
                except OSError as exc:
                    raise RankChannelError(
                        f"cannot connect to rank {rank} at {host}:{port} ({exc}); if the "
                        f"cluster's nodes cannot reach each other's free ports, set {ENV_SWITCH}=0"
                        " to send every call through Ray"
                    ) from exc
                sock.settimeout(None)
                _tune(sock)
                sock.sendall(token)
                self.sockets.append(sock)
        except BaseException:
            self.close()
            raise

    def call(self, requests: Sequence[bytes]) -> list[Any]:
        """Send ``requests[i]`` to rank ``i``; return the replies in rank order.

        Replies are read as they come, so a rank's exception, or the loss of its connection
        (RankChannelError), is raised as soon as it arrives, even while other ranks wait for
        that rank in a collective. A rank's exception carries its traceback as a note.
        """
        for rank in range(len(self.sockets)):
            while self.owed[rank]:
                self._receive(rank)
        for rank, (sock, request) in enumerate(zip(self.sockets, requests, strict=True)):
            try:
                send_frame(sock, request)
            except OSError as exc:
                raise self._lost(rank, exc) from exc
            self.owed[rank] += 1
        results: dict[int, Any] = {}
        with selectors.DefaultSelector() as waiting:
            for rank, sock in enumerate(self.sockets):
                waiting.register(sock, selectors.EVENT_READ, rank)
            while len(results) < len(self.sockets):
                for key, _ in waiting.select():
                    waiting.unregister(key.fileobj)
                    rank = key.data
                    try:
                        results[rank] = result_of(self._receive(rank), rank, self.pids[rank])
                    except RankChannelError:
                        raise
                    except BaseException as error:
                        pending = set(range(len(self.sockets))) - results.keys() - {rank}
                        lost = self._lost_peer(pending, PEER_LOSS_GRACE_S)
                        if lost is not None:
                            raise lost from error
                        raise
        return [results[rank] for rank in range(len(self.sockets))]

    def _lost_peer(self, pending: set[int], grace_s: float) -> RankChannelError | None:
        """Return the loss of a ``pending`` rank's connection seen within ``grace_s``, or None.

        A rank that raised may have failed only because a peer died under it (gloo's
        "Connection closed by peer" in a collective); which of the two the controller reads
        first is a race, so a death that follows within the grace is the error to report. A
        pending rank whose reply arrives meanwhile is alive; its reply stays owed.
        """
        deadline = time.monotonic() + grace_s
        with selectors.DefaultSelector() as waiting:
            for rank in pending:
                waiting.register(self.sockets[rank], selectors.EVENT_READ, rank)
            while waiting.get_map() and (left := deadline - time.monotonic()) > 0:
                for key, _ in waiting.select(left):
                    waiting.unregister(key.fileobj)
                    rank = key.data
                    try:
                        alive = self.sockets[rank].recv(1, socket.MSG_PEEK)
                    except OSError as exc:
                        return self._lost(rank, exc)
                    if not alive:
                        return self._lost(rank, ConnectionError("connection closed by the rank"))
        return None

    def _receive(self, rank: int) -> bytearray:
        try:
            reply = recv_frame(self.sockets[rank])
        except (ConnectionError, OSError) as exc:
            raise self._lost(rank, exc) from exc
        self.owed[rank] -= 1
        return reply

    def _lost(self, rank: int, exc: BaseException) -> RankChannelError:
        self.owed[rank] = 0
        self.broken = True
        return RankChannelError(
            f"rank {rank} (pid {self.pids[rank]}) closed its connection during a call ({exc}): "
            "the rank process died (killed, out of memory or crashed; its output is in the Ray "
            "session's worker logs) or its node went away",
            rank,
        )

    def close(self) -> None:
        """Close every connection; the ranks' serving threads end."""
        for sock in self.sockets:
            sock.close()
        self.sockets = []
