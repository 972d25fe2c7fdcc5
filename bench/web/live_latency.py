"""Latency of a training step from the driver's publish to the browser: median and p95 over 500 steps.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.web.live_latency [--steps 500] [--interval 0.1]

The whole path is the real one: a thread plays the run driver and records each step through
``RunRecorder.on_step`` (PostgreSQL upsert, heartbeat, then ``RunEventPublisher.publish`` on the
Redis channel layer); Daphne serves the studio's ASGI app in another process, where the run's
consumer forwards the event over the WebSocket; Debian's Chromium shows the run page, whose
charts.js receives the message and extends the Plotly traces. The publisher is wrapped only to
note the wall-clock time just before each publish; the page notes ``performance.timeOrigin +
performance.now()`` when the message arrives (``receivedAt``) and after the charts took it
(``drawnAt``). The browser's clock is aligned to Python's by the tightest of 20 round trips.

Reported: publish→receipt and publish→drawn (median, p95, max, ms), the recorder's whole step
(database writes + publish) →receipt, and the publish call itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

from bench.web.live_common import (
    bench_run,
    chromium,
    daphne,
    fresh_channel_layer,
    logged_in_context,
    percentile,
    scratch_database,
    setup_django,
    verl_metrics,
)

setup_django("bench_live_latency")

from django.db import connection  # noqa: E402

from workers.database_recorder import RunRecorder  # noqa: E402
from workers.publish import RunEventPublisher  # noqa: E402

COLLECT = """() => {
  window.__live = {};
  window.__drawn = {};
  document.addEventListener("run-live:metrics", (event) => {
    for (const step of event.detail.steps) window.__live[step] = event.detail.receivedAt;
  });
  document.addEventListener("run-live:drawn", (event) => {
    for (const step of event.detail.steps) window.__drawn[step] = event.detail.drawnAt;
  });
}"""


def note(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class TimedPublisher(RunEventPublisher):
    """The driver's publisher, noting the wall-clock time (ms) just before each metrics publish."""

    def __init__(self) -> None:
        super().__init__()
        self.sent_ms: dict[int, float] = {}

    def publish(self, message: dict[str, Any]) -> bool:
        if message.get("event") == "metrics":
            self.sent_ms[message["step"]] = time.time() * 1000
        return super().publish(message)


def drive(run_id: int, steps: range, interval_s: float, out: dict[str, Any]) -> None:
    """Record ``steps`` one every ``interval_s`` as the driver would; note the timings."""
    publisher = TimedPublisher()
    recorder = RunRecorder(run_id, publisher)
    started_ms: dict[int, float] = {}
    publish_ms: list[float] = []
    try:
        for step in steps:
            tick = time.perf_counter()
            started_ms[step] = time.time() * 1000
            before = publisher.failures
            recorder.on_step(step, verl_metrics(step))
            if publisher.failures != before:
                raise RuntimeError(f"publishing step {step} failed")
            publish_ms.append(time.time() * 1000 - publisher.sent_ms[step])
            time.sleep(max(0.0, interval_s - (time.perf_counter() - tick)))
    finally:
        publisher.close()
        connection.close()
    out.update(sent_ms=publisher.sent_ms, started_ms=started_ms, publish_ms=publish_ms)


class NetworkFrames:
    """Note when each metrics frame reaches Chromium's network stack (DevTools protocol).

    That is before the page's main thread sees it: the difference to the page's receipt is time
    the message waited while the page was busy painting.
    """

    def __init__(self, cdp: Any) -> None:
        self.wall_minus_monotonic: float | None = None
        self.arrived_ms: dict[int, float] = {}
        cdp.on("Network.webSocketWillSendHandshakeRequest", self.handshake)
        cdp.on("Network.webSocketFrameReceived", self.frame)
        cdp.send("Network.enable")

    def handshake(self, params: dict[str, Any]) -> None:
        self.wall_minus_monotonic = params["wallTime"] - params["timestamp"]

    def frame(self, params: dict[str, Any]) -> None:
        payload = params["response"]["payloadData"]
        if self.wall_minus_monotonic is None or not payload.startswith('{"type": "metrics"'):
            return
        at_ms = (self.wall_minus_monotonic + params["timestamp"]) * 1000
        for point in json.loads(payload)["points"]:
            self.arrived_ms.setdefault(point["step"], at_ms)


class SocketProbe(threading.Thread):
    """A second, headless client of the same run socket (aiohttp): the server path alone."""

    def __init__(self, url: str, session: str, last_step: int) -> None:
        super().__init__(daemon=True)
        self.url, self.session, self.last_step = url, session, last_step
        self.arrived_ms: dict[int, float] = {}
        self.ready = threading.Event()

    def run(self) -> None:
        asyncio.run(self.listen())

    async def listen(self) -> None:
        import aiohttp

        headers = {"Origin": self.url.replace("ws", "http", 1).split("/ws/")[0]}
        cookies = {"sessionid": self.session}
        async with (
            aiohttp.ClientSession(cookies=cookies) as session,
            session.ws_connect(self.url, headers=headers) as socket,
        ):
            self.ready.set()
            async for message in socket:
                at_ms = time.time() * 1000
                data = json.loads(message.data)
                for point in data.get("points", []) if data["type"] == "metrics" else []:
                    self.arrived_ms.setdefault(point["step"], at_ms)
                if self.last_step in self.arrived_ms:
                    return


def clock_offset_ms(page: Any) -> tuple[float, float]:
    """Return (browser clock - Python clock, its uncertainty) in ms from the tightest round trip."""
    best = None
    for _ in range(20):
        before = time.time() * 1000
        browser = page.evaluate("performance.timeOrigin + performance.now()")
        after = time.time() * 1000
        if best is None or after - before < best[1]:
            best = (browser - (before + after) / 2, after - before)
    return best[0], best[1] / 2


def stats(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 2),
        "p95": round(percentile(values, 95), 2),
        "max": round(max(values), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between steps")
    parser.add_argument("--warmup", type=int, default=20, help="steps recorded before the page")
    args = parser.parse_args()

    fresh_channel_layer()
    with scratch_database() as database, daphne(database) as base_url, chromium() as browser:
        note(f"server at {base_url}")
        run = bench_run(total_steps=args.warmup + args.steps)
        warmup = threading.Thread(target=drive, args=(run.pk, range(1, args.warmup + 1), 0.0, {}))
        warmup.start()
        warmup.join()
        context = logged_in_context(browser, base_url, run.owner)
        page = context.new_page()
        network = NetworkFrames(context.new_cdp_session(page))
        page.goto(f"{base_url}{run.get_absolute_url()}")
        page.wait_for_selector(".connection[data-state=live]", timeout=60000)
        page.wait_for_function(
            "() => window.postTrainCharts && window.postTrainCharts.panels.size >= 10",
            timeout=60000,
        )
        page.evaluate(COLLECT)
        note("page live; driving steps")
        offset, uncertainty = clock_offset_ms(page)

        first, last = args.warmup + 1, args.warmup + args.steps
        session = context.cookies()[0]["value"]
        ws_url = f"{base_url.replace('http', 'ws', 1)}/ws/runs/{run.pk}/?since={args.warmup}"
        probe = SocketProbe(ws_url, session, last)
        probe.start()
        probe.ready.wait(30)
        timings: dict[str, Any] = {}
        driver = threading.Thread(
            target=drive, args=(run.pk, range(first, last + 1), args.interval, timings)
        )
        driver.start()
        driver.join()
        note("driver done")
        probe.join(60)
        page.wait_for_function(
            f"() => Object.keys(window.__drawn).length >= {args.steps}", timeout=120000
        )
        received_at = {int(k): v for k, v in page.evaluate("window.__live").items()}
        drawn_at = {int(k): v for k, v in page.evaluate("window.__drawn").items()}
        visible = page.evaluate(
            "() => [...window.postTrainCharts.panels.values()].filter((p) => p.visible).length"
        )
        panels = page.evaluate("() => window.postTrainCharts.panels.size")
        context.close()

    steps = range(first, last + 1)
    probed = [probe.arrived_ms[s] - timings["sent_ms"][s] for s in steps]
    arrived = [network.arrived_ms[s] - timings["sent_ms"][s] for s in steps]
    received = [received_at[s] - offset - timings["sent_ms"][s] for s in steps]
    drawn = [drawn_at[s] - offset - timings["sent_ms"][s] for s in steps]
    whole = [received_at[s] - offset - timings["started_ms"][s] for s in steps]
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "steps": args.steps,
        "interval_s": args.interval,
        "metrics_per_step": len(verl_metrics(1)),
        "panels": panels,
        "panels_on_screen": visible,
        "clock_uncertainty_ms": round(uncertainty, 2),
        "publish_to_headless_client_ms": stats(probed),
        "publish_to_network_ms": stats(arrived),
        "publish_to_receipt_ms": stats(received),
        "publish_to_drawn_ms": stats(drawn),
        "on_step_to_receipt_ms": stats(whole),
        "publish_call_ms": stats(timings["publish_ms"]),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
