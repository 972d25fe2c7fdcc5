"""A run's own log: read by byte offsets in whole lines, searched, downloaded, and tailed live over
the run's socket to its owner only (issue 39, item 10)."""

from __future__ import annotations

from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from django.urls import reverse

from tests.webapp.fixtures import make_experiment
from tests.webapp.live import (  # noqa: F401  (fixtures)
    private_redis_layer,
    short_lived_connections,
)
from tests.webapp.runs.test_consumers import open_socket
from webapp.runs import logs
from webapp.runs.logs import (
    LogSearchError,
    clean_lines,
    log_read,
    log_search,
    run_log_path,
)
from webapp.runs.services import run_create


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)


def test_a_reader_gets_each_whole_line_once_from_where_it_stopped(tmp_path):
    path = tmp_path / "driver.log"
    assert log_read(path, None) is None  # no file yet
    write(path, "step 1 reward 0.5\nstép 2 ré".encode())  # the second line is not done
    first = log_read(path, None)
    assert (first.text, first.start, first.reset) == ("step 1 reward 0.5\n", 0, False)
    assert log_read(path, first.end) is None  # nothing whole is new
    write(path, b"ward 0.75\n")
    second = log_read(path, first.end)
    assert second.text == "stép 2 réward 0.75\n" and second.start == first.end
    assert second.end == path.stat().st_size


def test_colour_codes_go_and_a_progress_bar_reads_as_its_last_state():
    assert clean_lines("\x1b[31mERROR\x1b[0m boom") == "ERROR boom"
    assert clean_lines("gen  10%\rgen  50%\rgen 100%\r\nnext") == "gen 100%\nnext"


def test_a_tail_starts_at_a_whole_line_and_a_reader_far_behind_skips_ahead(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "TAIL_BYTES", 20)
    monkeypatch.setattr(logs, "CHUNK_BYTES", 40)
    path = tmp_path / "driver.log"
    write(path, b"".join(b"line %02d\n" % i for i in range(10)))  # 8 bytes a line
    tail = log_read(path, None)
    # The last 20 bytes start inside line 07: the tail is lines 08 and 09.
    assert (tail.text, tail.start, tail.skipped) == ("line 08\nline 09\n", 64, 0)
    behind = log_read(path, 8)  # 72 bytes behind, past CHUNK_BYTES: skip to the tail
    assert (behind.text, behind.start, behind.skipped) == ("line 08\nline 09\n", 64, 56)
    near = log_read(path, 48)  # 32 bytes behind: read on
    assert (near.text, near.skipped) == ("line 06\nline 07\nline 08\nline 09\n", 0)


def test_a_replaced_log_is_read_from_its_start_with_reset(tmp_path):
    path = tmp_path / "driver.log"
    write(path, b"old old old old\n")
    end = log_read(path, None).end
    path.write_bytes(b"new\n")
    chunk = log_read(path, end)
    assert (chunk.text, chunk.reset, chunk.start) == ("new\n", True, 0)


def test_search_reads_the_whole_log_ignoring_case(tmp_path, monkeypatch):
    path = tmp_path / "driver.log"
    write(path, b"start\nTraceback (most recent call last):\n  boom\nsecond traceback\n")
    found = log_search(path, "traceback")
    assert found.matches == [(2, "Traceback (most recent call last):"), (4, "second traceback")]
    assert not found.truncated
    monkeypatch.setattr(logs, "SEARCH_MAX_MATCHES", 1)
    assert log_search(path, "TRACEBACK").truncated
    assert log_search(tmp_path / "missing.log", "x").matches == []
    with pytest.raises(LogSearchError, match="type the text to find"):
        log_search(path, "  ")
    with pytest.raises(LogSearchError, match="at most 200 characters"):
        log_search(path, "x" * 201)


@pytest.mark.django_db
def test_the_owner_downloads_and_searches_the_log_and_another_member_gets_a_404(
    client_in, owner, other_user, client
):
    run = run_create(experiment=make_experiment(owner, name="logged"))
    download = reverse("runs:log", kwargs={"run_id": run.pk})
    search = reverse("runs:log-search", kwargs={"run_id": run.pk})
    assert client_in.get(download).status_code == 404  # the driver has written nothing yet
    assert client_in.get(search, {"q": "x"}).json() == {"matches": [], "truncated": False}
    write(run_log_path(run), b"loading tiny://model\n<script>alert(1)</script>\nrun done\n")
    response = client_in.get(download)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-driver.log"'
    assert b"".join(response.streaming_content).startswith(b"loading tiny://model\n")
    answer = client_in.get(search, {"q": "SCRIPT"}).json()
    assert answer == {
        "matches": [{"line": 2, "text": "<script>alert(1)</script>"}],
        "truncated": False,
    }
    bad = client_in.get(search, {"q": ""})
    assert bad.status_code == 400 and bad.json()["error"].startswith("type the text to find")
    client.force_login(other_user)
    assert client.get(download).status_code == 404
    assert client.get(search, {"q": "run"}).status_code == 404


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@pytest.mark.usefixtures("private_redis_layer", "short_lived_connections")
async def test_the_socket_tails_the_log_to_its_owner_only(owner, other_user):
    run = await database_sync_to_async(
        lambda: run_create(experiment=make_experiment(owner, name="logged"))
    )()
    path = run_log_path(run)
    write(path, b"loading tiny://model\n")
    socket = await open_socket(f"/ws/runs/{run.pk}/?log=", owner)
    tail = await next_log(socket)
    assert tail["text"] == "loading tiny://model\n" and tail["offset"] == path.stat().st_size
    write(path, b"step 1: reward 0.5\nhalf a li")
    added = await next_log(socket)
    assert added["text"] == "step 1: reward 0.5\n" and not added["reset"]
    await socket.disconnect()
    # A reconnect from the offset it had gets what came after, once.
    write(path, b"ne\n")
    again = await open_socket(f"/ws/runs/{run.pk}/?since=0&log={added['offset']}", owner)
    assert (await next_log(again))["text"] == "half a line\n"
    await again.disconnect()
    stranger = await open_socket(f"/ws/runs/{run.pk}/?log=", other_user)
    closed = await stranger.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": 4403}
    await stranger.disconnect()


async def next_log(socket) -> dict:
    """Return the socket's next ``log`` message, passing over its other messages."""
    for _ in range(20):
        message = await socket.receive_json_from(timeout=10)
        if message["type"] == "log":
            return message
    raise AssertionError("no log message came")


def test_the_log_offset_of_a_socket_must_be_a_whole_number():
    from webapp.runs.consumers import _log_offset

    assert _log_offset("") is None and _log_offset("12") == 12
    with pytest.raises(ValueError, match="log='-1' is not a byte offset"):
        _log_offset("-1")
