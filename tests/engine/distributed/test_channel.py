"""The direct channel between the controller and its ranks, over real sockets on this machine.

The rank's end (``ChannelServer``) runs here in a thread with a plain handler; the Ray ranks that
serve it in a run are tested in ``test_ray.py``.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from engine.distributed import channel
from engine.distributed.channel import (
    ChannelServer,
    RankChannelError,
    RankChannels,
    pack,
    reply_for,
    unpack,
)


def serve(handler) -> tuple[ChannelServer, tuple[str, int, bytes]]:
    server = ChannelServer(lambda request: reply_for(lambda: handler(unpack(request))), "127.0.0.1")
    return server, (*server.address, server.token)


def test_requests_go_to_each_rank_and_replies_come_back_in_rank_order():
    servers = [serve(lambda x, r=rank: (r, x)) for rank in range(3)]
    channels = RankChannels([endpoint for _, endpoint in servers], pids=[10, 11, 12])
    try:
        replies = channels.call([pack(f"to {rank}") for rank in range(3)])
        assert replies == [(0, "to 0"), (1, "to 1"), (2, "to 2")]
    finally:
        channels.close()


def test_a_frame_larger_than_one_write_arrives_whole():
    big = bytes(range(256)) * 20_000  # 5 MB, past the single-write size and the socket buffers
    server, endpoint = serve(lambda x: x[::-1])
    channels = RankChannels([endpoint], pids=[1])
    try:
        assert channels.call([pack(big)]) == [big[::-1]]
    finally:
        channels.close()


def test_a_rank_error_is_raised_with_its_type_and_the_rank_traceback_and_the_channel_survives():
    def handler(x):
        if x == "bad":
            raise ValueError("data.max_prompt_length is too small")
        return x

    servers = [serve(handler) for _ in range(2)]
    channels = RankChannels([endpoint for _, endpoint in servers], pids=[21, 22])
    try:
        with pytest.raises(ValueError, match="max_prompt_length") as info:
            channels.call([pack("bad"), pack("fine")])
        notes = "\n".join(info.value.__notes__)
        assert "raised on rank 0 (pid 21)" in notes and "in handler" in notes
        # Rank 1's reply to the failed call may still be unread: it must not answer the next.
        assert channels.call([pack("a"), pack("b")]) == ["a", "b"]
    finally:
        channels.close()


def test_a_rank_error_is_raised_while_another_rank_is_still_busy():
    # On a real group the busy rank would be waiting for the failed one in a collective.
    release = threading.Event()

    def busy(x):
        release.wait(30)
        return x

    def failing(x):
        if x == "b":
            raise RuntimeError("out of memory on rank 1")
        return x

    servers = [serve(busy), serve(failing)]
    channels = RankChannels([endpoint for _, endpoint in servers], pids=[1, 2])
    try:
        with pytest.raises(RuntimeError, match="out of memory on rank 1") as info:
            channels.call([pack("a"), pack("b")])
        assert not release.is_set()  # raised before rank 0 answered
        assert "raised on rank 1 (pid 2)" in "\n".join(info.value.__notes__)
        release.set()  # rank 0 answers the failed call late; the next call skips that answer
        assert channels.call([pack("c"), pack("d")]) == ["c", "d"]
    finally:
        release.set()
        channels.close()


class Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("no")


class NeedsTwoArguments(Exception):
    """Pickles, but unpickling calls __init__ with the message alone and fails."""

    def __init__(self, key, value):
        super().__init__(f"{key} cannot be {value}")


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (Unpicklable("lock held"), "Unpicklable: lock held"),
        (NeedsTwoArguments("lr", -1), "NeedsTwoArguments: lr cannot be -1"),
    ],
)
def test_an_error_that_does_not_travel_comes_back_as_a_runtime_error_naming_it(error, message):
    def handler(_):
        raise error

    server, endpoint = serve(handler)
    channels = RankChannels([endpoint], pids=[5])
    try:
        with pytest.raises(RuntimeError, match=message) as info:
            channels.call([pack(None)])
        assert "in handler" in "\n".join(info.value.__notes__)
    finally:
        channels.close()


def test_a_rank_that_goes_away_mid_call_is_named():
    # The handler's thread ends the connection instead of answering, as a dead process's would.
    accepted = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def vanish():
        conn, _ = listener.accept()
        conn.recv(1 << 16)
        accepted.set()
        conn.close()

    thread = threading.Thread(target=vanish, daemon=True)
    thread.start()
    channels = RankChannels([("127.0.0.1", port, b"t" * channel.TOKEN_BYTES)], pids=[4242])
    try:
        with pytest.raises(RankChannelError, match=r"rank 0 \(pid 4242\) closed its connection"):
            channels.call([pack("x")])
    finally:
        channels.close()
        listener.close()
    assert accepted.is_set()


def test_a_rank_error_caused_by_a_peer_dying_under_it_names_the_dead_peer():
    # Rank 1 dies; rank 0, in a collective with it, fails with gloo's error and answers first.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    answered = threading.Event()

    def dies_after_rank_0_answers():
        conn, _ = listener.accept()
        conn.recv(1 << 16)
        answered.wait(10)
        time.sleep(0.3)  # the controller reads rank 0's error first, then this death
        conn.close()

    def collective(_):
        answered.set()
        raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")

    threading.Thread(target=dies_after_rank_0_answers, daemon=True).start()
    server, endpoint = serve(collective)
    channels = RankChannels(
        [endpoint, ("127.0.0.1", port, b"t" * channel.TOKEN_BYTES)], pids=[30, 31]
    )
    try:
        with pytest.raises(
            RankChannelError, match=r"rank 1 \(pid 31\) closed its connection"
        ) as info:
            channels.call([pack("a"), pack("b")])
        assert "Connection closed by peer" in str(info.value.__cause__)
    finally:
        channels.close()
        listener.close()


def test_a_connection_without_the_token_is_refused_and_the_controller_still_gets_in():
    server, endpoint = serve(lambda x: x + 1)
    with socket.create_connection(server.address) as stranger:
        stranger.sendall(b"x" * channel.TOKEN_BYTES)
        assert stranger.recv(1) == b""  # closed on it
    channels = RankChannels([endpoint], pids=[1])
    try:
        assert channels.call([pack(1)]) == [2]
    finally:
        channels.close()


def test_an_unreachable_rank_names_its_address_and_the_switch():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed below: nothing listens there
    with pytest.raises(RankChannelError, match=rf"127.0.0.1:{port}.*POSTTRAIN_RANK_CHANNEL=0"):
        RankChannels([("127.0.0.1", port, b"t" * channel.TOKEN_BYTES)], pids=[1])


@pytest.mark.parametrize(("value", "on"), [("1", True), ("0", False), ("off", False), ("", None)])
def test_the_switch_reads_the_environment_and_refuses_other_values(monkeypatch, value, on):
    monkeypatch.setenv(channel.ENV_SWITCH, value)
    if on is None:
        with pytest.raises(ValueError, match="POSTTRAIN_RANK_CHANNEL=''"):
            channel.enabled()
    else:
        assert channel.enabled() is on
