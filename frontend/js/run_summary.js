// The run page beside its charts, kept live from the run's socket (charts.js hands over each
// message): status, step, start and end times, heartbeat, stall note, checkpoint, driver, a
// failed run's error, sample count, the latest-metrics table and the cancel/resume/delete
// buttons. The server renders the first paint and embeds the run's state snapshot (#run-state),
// which this applies at once, as it applies the snapshot every status and metrics message
// carries (a heartbeat of the driver is a status message); it only updates the elements marked
// with data-field="...".
//
// The heartbeat is the newest of the last heartbeat time the socket sent (a status message) and
// the time of the last step it sent (the driver beats it with each step), and ticks here; that
// step also ends a stall note. The
// sample count adds the `samples` messages of steps after the latest-metrics step of the first
// paint (a step's samples and metrics land in one transaction), each (step, split) once.

import {element, readJson} from "./dom.js";
import {formatMetric} from "./numbers.js";

const TICK_MS = 1000;

// Seconds as "12 seconds ago", "5 minutes ago", "3 hours ago", "2 days ago".
export function ago(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  const [value, unit] =
    s < 120 ? [s, "second"] : s < 7200 ? [Math.floor(s / 60), "minute"] : s < 172800 ? [Math.floor(s / 3600), "hour"] : [Math.floor(s / 86400), "day"];
  return `${value} ${unit}${value === 1 ? "" : "s"}`;
}


// The summary names first (in their order), then the rest by name: selectors.run_latest_metrics.
export function orderMetrics(metrics, summaryNames) {
  const first = summaryNames.filter((name) => name in metrics).map((name) => [name, metrics[name]]);
  const summary = new Set(summaryNames);
  const rest = Object.keys(metrics)
    .filter((name) => !summary.has(name))
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))
    .map((name) => [name, metrics[name]]);
  return first.concat(rest);
}

export class RunSummary {
  constructor(doc = document) {
    this.doc = doc;
    this.summary = doc.getElementById("run-summary");
    this.summaryNames = readJson("summary-metrics") || [];
    const zone = this.summary.dataset.timeZone || "UTC";
    // sv-SE writes "2025-03-01 12:00:00", Django's "Y-m-d H:i:s" on the first paint.
    this.dateFormat = new Intl.DateTimeFormat("sv-SE", {
      timeZone: zone, year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false,
    });
    const heartbeat = this.field("heartbeat");
    this.heartbeatAt = heartbeat.dataset.at ? Number(heartbeat.dataset.at) : null;
    const stalled = this.field("stalled");
    this.stalledSince = stalled.dataset.since ? Number(stalled.dataset.since) : null;
    this.run = null;
    this.latestStep = null;
    const firstStep = this.summary.dataset.metricsStep;
    this.metricsStep = firstStep === "" ? null : Number(firstStep);
    this.sampleBase = Number(this.field("sample-count").textContent);
    this.sampleCounts = new Map(); // "step/split" -> count, for samples after the first paint
    this.samplesAfter = this.metricsStep ?? -1;
    // The server's snapshot of the run (webapp.runs.state.run_state), the very one each socket
    // message carries: the first paint goes through the same code as every update after it.
    const initial = readJson("run-state");
    if (initial) this.showRun(initial);
    this.tick();
    this.timer = setInterval(() => this.tick(), TICK_MS);
  }

  field(name) {
    return this.doc.querySelector(`[data-field="${name}"]`);
  }

  formatTime(seconds) {
    return seconds === null ? "—" : this.dateFormat.format(new Date(seconds * 1000));
  }

  take(message) {
    if (message.run) this.showRun(message.run);
    if (message.type === "metrics" && message.points.length) {
      const last = message.points[message.points.length - 1];
      this.heartbeatAt = Math.max(this.heartbeatAt ?? 0, last.time);
      // A new step ends a stall (driver_writes.run_heartbeat clears it without a status message).
      if (this.stalledSince !== null && last.time > this.stalledSince) this.stalledSince = null;
      this.showStep(last.step);
      this.showMetrics(last);
      this.tick();
    } else if (message.type === "samples") {
      this.countSamples(message);
    }
  }

  showRun(run) {
    this.run = run;
    // The launch's "queued" note is true only while the run waits (views.flash_launched).
    if (run.status !== "queued") for (const note of this.doc.querySelectorAll(`.message.launched-run-${run.id}`)) note.remove();
    const badge = this.summary.querySelector(".status");
    badge.className = `status status-${run.status}`;
    badge.textContent = run.status;
    this.field("cancel-requested").hidden = !(run.cancel_requested && run.is_active);
    this.stalledSince = run.stalled_since;
    if (run.heartbeat_at !== null) this.heartbeatAt = Math.max(this.heartbeatAt ?? 0, run.heartbeat_at);
    this.field("started").textContent = this.formatTime(run.started_at);
    this.field("finished").textContent = this.formatTime(run.finished_at);
    this.field("driver").textContent = run.driver || "—";
    if ("error" in run) {
      // A run the studio stops (its rewards keep failing) says why before it ends.
      const text = run.error || run.failure_reason || "";
      const error = this.field("error");
      error.hidden = !text;
      error.querySelector(".traceback").textContent = text;
    }
    if (run.latest_checkpoint) this.field("checkpoint").replaceChildren(element("code", {text: run.latest_checkpoint}));
    this.latestStep = null; // the run's own step wins over the steps seen so far
    this.showStep(run.latest_step);
    this.showButtons(run);
    this.tick();
  }

  showStep(step) {
    if (this.latestStep !== null && step < this.latestStep) return;
    this.latestStep = step;
    const run = this.run;
    let text = String(step);
    if (run && run.total_steps) text += ` / ${run.total_steps}`;
    if (run && run.start_step) text += ` (resumed at ${run.start_step})`;
    if (run) this.field("step").textContent = text;
  }

  showButtons(run) {
    const cancel = this.field("cancel");
    cancel.hidden = !(run.can_cancel ?? run.is_active);
    const stop = cancel.querySelector("button");
    if (!cancel.dataset.submitted) {
      stop.disabled = run.cancel_requested;
      stop.textContent = run.cancel_requested ? "Stopping…" : "Cancel";
    }
    const resume = this.field("resume");
    resume.hidden = !run.can_resume;
    const button = resume.querySelector("button");
    if (!resume.dataset.submitted && run.latest_checkpoint) {
      button.disabled = false;
      button.removeAttribute("title");
    }
    this.field("delete").hidden = run.is_active;
  }

  showMetrics(point) {
    if (this.metricsStep !== null && point.step < this.metricsStep) return;
    this.metricsStep = point.step;
    const label = this.field("metrics-step");
    label.textContent = `(step ${point.step})`;
    label.hidden = false;
    const rows = orderMetrics(point.metrics, this.summaryNames).map(([name, value]) =>
      element("tr", {}, [element("th", {text: name}), element("td", {text: formatMetric(value)})]),
    );
    const table = this.field("metrics");
    table.querySelector("tbody").replaceChildren(...rows);
    table.hidden = rows.length === 0;
    this.field("no-metrics").hidden = rows.length > 0;
  }

  countSamples(message) {
    if (message.step <= this.samplesAfter) return;
    this.sampleCounts.set(`${message.step}/${message.split}`, message.count || 0);
    let total = this.sampleBase;
    for (const count of this.sampleCounts.values()) total += count;
    this.field("sample-count").textContent = String(total);
  }

  tick() {
    const now = Date.now() / 1000;
    const heartbeat = this.field("heartbeat");
    if (this.heartbeatAt !== null) heartbeat.textContent = `${ago(now - this.heartbeatAt)} ago`;
    const stalled = this.field("stalled");
    const running = (this.run ? this.run.status : this.summary.querySelector(".status").textContent) === "running";
    stalled.hidden = !(this.stalledSince !== null && running);
    if (!stalled.hidden) {
      const note = stalled.querySelector(".stalled");
      note.textContent = `stalled: no new step for ${ago(now - this.stalledSince)}`;
      note.title = `the driver lives but has recorded no step since ${this.formatTime(this.stalledSince)}`;
    }
  }
}
