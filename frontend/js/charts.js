// Live charts of a run: one WebSocket per run, a grid of Plotly panels built from the metric
// names the server reports, updated in place (extendTraces) as each step lands.
//
// The server sends each series already downsampled (min/max buckets, ~1,500 points); zooming
// asks it for the visible step range at the same budget and merges the finer points in.
// Smoothing is TensorBoard's debiased exponential moving average, drawn over the faint raw line;
// hover always reads the raw values. Panels with many points switch to WebGL (scattergl) when a
// GPU draws it. After a drop the socket reconnects with ?since=<last step> and gets exactly the
// steps it missed. compare.js reuses RunStream and ChartGrid to overlay several runs.

import {element} from "./dom.js";
import {RunHealth} from "./health.js";
import {RunCheckpoints} from "./run_checkpoints.js";
import {RunLog} from "./run_log.js";
import {RunSummary} from "./run_summary.js";
import {RunStream, SeriesStore, emaNext, emaStart, emptySeries, mergeRange} from "./stream.js";
import {formatMetric} from "./numbers.js";
import {flatRange, panelTraces, valueSpan, xValues} from "./traces.js";

export {RunStream, SeriesStore};

const WEBGL_POINTS = 4000; // points in one panel above which WebGL draws faster than SVG
const REFRESH_POINTS = 3000; // a live series this long is fetched again, downsampled
// Repaint live panels at most 5 times a second: a repaint costs tens of ms per panel, and steps
// that land faster than that are drawn together instead of starving the socket of CPU.
const MIN_REPAINT_MS = 200;

// WebGL only where it is drawn by a GPU: a software rasteriser (SwiftShader, llvmpipe) runs it on
// the CPU, slower than SVG.
export const hasWebGL = (() => {
  try {
    const gl = document.createElement("canvas").getContext("webgl");
    if (!gl) return false;
    const info = gl.getExtension("WEBGL_debug_renderer_info");
    const renderer = String(gl.getParameter(info ? info.UNMASKED_RENDERER_WEBGL : gl.RENDERER));
    return !/swiftshader|llvmpipe|softpipe|software/i.test(renderer);
  } catch (error) {
    return false;
  }
})();

// A grid of panels over one or more runs ("sources"), each with its own SeriesStore.
export class ChartGrid {
  constructor(root, {sources, seriesUrl, pngName}) {
    this.root = root;
    this.grid = root.querySelector(".chart-grid");
    this.sources = sources; // [{id, label, color, store}]
    this.seriesUrl = seriesUrl; // (sourceId) => URL of the zoom-refinement endpoint
    this.pngName = pngName || "chart";
    this.panels = new Map();
    this.options = {smoothing: 0.6, x: "step", log: false, band: "minmax"};
    this.pending = new Set();
    this.changed = new Set(); // panels with points not drawn yet
    this.steps = new Set(); // the steps they came with (announced once drawn)
    this.lastFlush = -Infinity;
    this.drawn = false;
    // Panels off screen (with a margin) are not repainted per step; they redraw when they show.
    this.observer = new IntersectionObserver((entries) => {
      for (const entry of entries) {
        const panel = [...this.panels.values()].find((p) => p.figure === entry.target);
        if (!panel) continue;
        panel.visible = entry.isIntersecting;
        if (panel.visible && panel.dirty) this.draw(panel);
      }
    }, {rootMargin: "300px"});
    this.bindToolbar(root.querySelector(".chart-toolbar"));
    if (!window.Plotly) {
      window.addEventListener("DOMContentLoaded", () => {
        for (const panel of this.panels.values()) if (panel.dirty) this.draw(panel);
      });
    }
  }

  source(id) {
    return this.sources.find((s) => s.id === id);
  }

  bindToolbar(toolbar) {
    if (!toolbar) return;
    const slider = toolbar.querySelector("[name=smoothing]");
    const shown = toolbar.querySelector(".smoothing-value");
    if (slider) {
      slider.value = this.options.smoothing;
      if (shown) shown.textContent = Number(slider.value).toFixed(2);
      slider.addEventListener("input", () => {
        this.options.smoothing = Number(slider.value);
        if (shown) shown.textContent = this.options.smoothing.toFixed(2);
        this.redrawAll();
      });
    }
    const xaxis = toolbar.querySelector("[name=xaxis]");
    if (xaxis) xaxis.addEventListener("change", () => { this.options.x = xaxis.value; this.redrawAll(); });
    const log = toolbar.querySelector("[name=log]");
    if (log) log.addEventListener("change", () => { this.options.log = log.checked; this.redrawAll(); });
  }

  // Add the panels the server named ([{key, title, order, names}]), in page order.
  addPanels(panels) {
    for (const p of panels) {
      let panel = this.panels.get(p.key);
      if (!panel) {
        const plot = element("div", {class: "chart-plot"});
        const png = element("button", {type: "button", class: "chart-png", title: "Download PNG", text: "PNG"});
        const figure = element("figure", {class: "chart-panel", "data-panel": p.key, "data-order": p.order}, [
          element("figcaption", {}, [element("span", {text: p.title}), png]),
          plot,
        ]);
        panel = {key: p.key, title: p.title, order: p.order, names: [], figure, plot, traces: [], ema: new Map(), visible: false, dirty: true};
        png.addEventListener("click", () => this.downloadPng(panel));
        const after = [...this.panels.values()].filter((q) => q.order < p.order || (q.order === p.order && q.key < p.key));
        const before = [...this.grid.children].find((node) => !after.some((q) => q.figure === node));
        this.grid.insertBefore(figure, before || null);
        this.panels.set(p.key, panel);
        this.observer.observe(figure);
      }
      for (const name of p.names) if (!panel.names.includes(name)) panel.names.push(name);
      panel.names.sort();
    }
  }

  // A metric may be drawn in two panels (a panel's companions, webapp/runs/metrics.py).
  panelsOf(name) {
    return [...this.panels.values()].filter((panel) => panel.names.includes(name));
  }

  // The panel's traces (traces.js), with the EMA states that extend() carries on from.
  buildTraces(panel) {
    const type = hasWebGL && this.panelPoints(panel) > WEBGL_POINTS ? "scattergl" : "scatter";
    const sources = this.sources.map((src) => ({id: src.id, label: src.label, color: src.color, series: src.store.series, band: src.band, members: src.members, count: src.count}));
    const {traces, index, ema} = panelTraces({sources, names: panel.names, smoothing: this.options.smoothing, x: this.options.x, type, band: this.options.band});
    panel.ema = ema;
    panel.type = type;
    return {traces, index};
  }

  // One series needs no legend (the panel's title names it), and a legend costs half a repaint.
  layout(panel, series) {
    const time = this.options.x === "time";
    return {
      margin: {l: 56, r: 12, t: 8, b: 36},
      height: 250,
      showlegend: series > 1,
      legend: {orientation: "h", y: -0.22, font: {size: 11}},
      hovermode: "closest",
      xaxis: {type: time ? "date" : "linear", title: {text: time ? "wall time" : "step", standoff: 4}, automargin: true},
      yaxis: {type: this.options.log ? "log" : "linear", exponentformat: "e", automargin: true, ...yRange(panel.flat)},
      uirevision: `${this.options.x}:${this.options.log}`,
      font: {family: "system-ui, sans-serif", size: 11},
    };
  }

  draw(panel) {
    // Plotly loads after this script (deferred), so the socket opens while Plotly is parsed.
    if (!panel.visible || !window.Plotly) {
      panel.dirty = true;
      return;
    }
    panel.dirty = false;
    const {traces, index} = this.buildTraces(panel);
    panel.traces = index;
    panel.span = valueSpan(traces);
    panel.flat = flatRange(panel.span, this.options.log);
    const config = {responsive: true, displaylogo: false, toImageButtonOptions: {format: "png", filename: `${this.pngName}-${panel.key}`}};
    Plotly.react(panel.plot, traces, this.layout(panel, index.filter((t) => !t.smoothed).length), config);
    if (!panel.listening) {
      panel.listening = true;
      panel.plot.on("plotly_relayout", (event) => this.refine(panel, event));
    }
    if (!this.drawn && traces.length) {
      this.drawn = true;
      performance.mark("posttrain:first-chart");
      document.dispatchEvent(new CustomEvent("run-live:first-chart", {detail: {panel: panel.key}}));
    }
  }

  redraw(keys) {
    for (const key of keys) this.pending.add(key);
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = null;
      const keys = [...this.pending];
      this.pending.clear();
      for (const key of keys) this.draw(this.panels.get(key));
    });
  }

  redrawAll() {
    this.redraw(this.panels.keys());
  }

  // Show a source's backlog: replace its series and redraw the panels they belong to.
  setSeries(sourceId, panels, series, lastStep) {
    this.addPanels(panels);
    this.source(sourceId).store.replace(series, lastStep);
    const keys = new Set(Object.keys(series).flatMap((name) => this.panelsOf(name).map((panel) => panel.key)));
    // The first chart is drawn now, not on the next frame: the page's first paint waits for it.
    for (const key of keys) this.draw(this.panels.get(key));
  }

  // Take live points into the store now; draw them with the next repaint (see MIN_REPAINT_MS).
  appendPoints(sourceId, panels, points) {
    if (panels) this.addPanels(panels);
    const added = this.source(sourceId).store.append(points);
    for (const point of added) {
      for (const panel of this.panelsOf(point.name)) this.changed.add(panel.key);
      this.steps.add(point.step);
    }
    this.schedule();
  }

  schedule() {
    if (this.flushing || this.painting || !this.changed.size) return;
    this.flushing = true;
    const wait = Math.max(0, this.lastFlush + MIN_REPAINT_MS - performance.now());
    setTimeout(() => requestAnimationFrame(() => this.flush()), wait);
  }

  // Extend each changed, visible panel by the points its traces do not show yet, one panel per
  // task so the socket is read between repaints; panels off screen redraw when they show.
  flush() {
    this.flushing = false;
    this.painting = true;
    this.lastFlush = performance.now();
    const keys = [...this.changed];
    const steps = [...this.steps];
    this.changed.clear();
    this.steps.clear();
    const next = () => {
      const key = keys.shift();
      if (key === undefined) {
        this.painting = false;
        announce("run-live:drawn", {steps});
        this.schedule();
        return;
      }
      const panel = this.panels.get(key);
      if (!panel.visible || !window.Plotly) panel.dirty = true;
      else if (panel.dirty) this.draw(panel);
      else this.extend(panel);
      setTimeout(next, 0);
    };
    next();
  }

  extend(panel) {
    const smoothing = this.options.smoothing;
    const update = {x: [], y: [], indices: []};
    for (const [i, trace] of panel.traces.entries()) {
      if (trace.band) continue; // a group's band is fetched whole again (compare.js)
      const s = this.source(trace.source).store.get(trace.name);
      const from = trace.drawn;
      if (s.step.length <= from) continue;
      const xs = xValues(s, this.options.x, from);
      let ys = s.value.slice(from);
      if (trace.smoothed) {
        const key = `${trace.source}:${trace.name}`;
        if (!panel.ema.has(key)) panel.ema.set(key, emaStart());
        const state = panel.ema.get(key);
        ys = ys.map((v) => emaNext(state, v, smoothing));
      }
      trace.drawn = s.step.length;
      update.indices.push(i);
      update.x.push(xs);
      update.y.push(ys);
    }
    // A constant panel's axis is fixed around its value: a new value moves or frees it.
    panel.span = valueSpan(null, panel.span, update.y.flat());
    const flat = flatRange(panel.span, this.options.log);
    if (JSON.stringify(flat) !== JSON.stringify(panel.flat)) return this.draw(panel);
    const names = new Set(panel.traces.map((t) => `${t.source}:${t.name}`));
    const missing = this.sources.some((src) => panel.names.some((name) => src.store.get(name)?.step.length && !names.has(`${src.id}:${name}`)));
    const long = hasWebGL && panel.type === "scatter" && this.panelPoints(panel) > WEBGL_POINTS;
    if (missing || long) return this.draw(panel);
    if (update.indices.length) Plotly.extendTraces(panel.plot, {x: update.x, y: update.y}, update.indices);
    for (const src of this.sources) {
      if (src.band) continue;
      if (panel.names.some((name) => (src.store.get(name)?.step.length || 0) > REFRESH_POINTS) && !panel.refreshing) this.refresh(panel, src.id);
    }
  }

  panelPoints(panel) {
    return this.sources.reduce((sum, src) => sum + panel.names.reduce((n, name) => n + (src.store.get(name)?.step.length || 0), 0), 0);
  }

  async fetchSeries(sourceId, names, lo, hi) {
    const src = this.source(sourceId);
    const params = new URLSearchParams(src?.seriesParams || []); // a group's: its members' ids
    for (const name of names) params.append("name", name);
    if (lo !== null) params.set("from", lo);
    if (hi !== null) params.set("to", hi);
    const url = src?.seriesUrl || this.seriesUrl(sourceId);
    const response = await fetch(`${url}?${params}`, {credentials: "same-origin"});
    if (!response.ok) throw new Error(`series request failed: ${response.status}`);
    return response.json();
  }

  // Zoom: fetch the visible step range of this panel's series and merge the finer points in.
  async refine(panel, event) {
    let [lo, hi] = event["xaxis.range"] || [event["xaxis.range[0]"], event["xaxis.range[1]"]];
    if (panel.refining || lo === undefined || hi === undefined) return;
    if (this.options.x === "time") [lo, hi] = this.stepsForTimes(panel, Date.parse(lo) / 1000, Date.parse(hi) / 1000);
    if (lo === null) return;
    lo = Math.max(0, Math.floor(lo));
    hi = Math.ceil(hi);
    panel.refining = true;
    try {
      for (const src of this.sources) {
        const names = panel.names.filter((name) => src.store.get(name));
        if (!names.length) continue;
        const result = await this.fetchSeries(src.id, names, lo, hi);
        for (const [name, fine] of Object.entries(result.series)) {
          src.store.series.set(name, mergeRange(src.store.get(name), fine, lo, hi));
        }
      }
      this.draw(panel);
    } catch (error) {
      console.warn(error);
    } finally {
      panel.refining = false;
    }
  }

  stepsForTimes(panel, t0, t1) {
    let lo = null;
    let hi = null;
    for (const src of this.sources) {
      for (const name of panel.names) {
        const s = src.store.get(name);
        if (!s) continue;
        s.time.forEach((t, i) => {
          if (t < t0 || t > t1) return;
          lo = lo === null ? s.step[i] : Math.min(lo, s.step[i]);
          hi = hi === null ? s.step[i] : Math.max(hi, s.step[i]);
        });
      }
    }
    return [lo, hi];
  }

  // A live series grew long: fetch it downsampled again, keeping points newer than the answer.
  async refresh(panel, sourceId) {
    panel.refreshing = true;
    const src = this.source(sourceId);
    try {
      const result = await this.fetchSeries(sourceId, panel.names, null, null);
      if (result.last_step === null) return;
      for (const [name, s] of Object.entries(result.series)) {
        const current = src.store.get(name) || emptySeries();
        const newer = mergeRange(current, emptySeries(), -Infinity, result.last_step);
        src.store.series.set(name, mergeRange(s, newer, result.last_step + 1, Infinity));
      }
      this.draw(panel);
    } catch (error) {
      console.warn(error);
    } finally {
      panel.refreshing = false;
    }
  }

  downloadPng(panel) {
    const {width, height} = panel.plot.getBoundingClientRect();
    return Plotly.downloadImage(panel.plot, {
      format: "png", filename: `${this.pngName}-${panel.key}`, width: Math.round(width) || 700, height: Math.round(height) || 250,
    });
  }
}

// A fixed y range for a constant panel (traces.flatRange), else Plotly's autorange.
function yRange(flat) {
  return flat ? {range: flat, autorange: false} : {autorange: true};
}

// Show a run's progress (computed by the server) in every bar of that run on the page.
export function showProgress(runId, progress) {
  if (!progress) return;
  for (const bar of document.querySelectorAll(`[data-run-progress="${runId}"]`)) {
    bar.dataset.status = progress.status;
    const fill = bar.querySelector(".run-progress-bar span");
    if (fill) fill.style.width = `${progress.percent ?? 0}%`;
    const meter = bar.querySelector(".run-progress-bar");
    if (meter && progress.percent !== null) meter.setAttribute("aria-valuenow", progress.percent);
    const text = bar.querySelector(".run-progress-text");
    if (text) text.textContent = progress.text;
  }
}

export function showConnection(root, state, detail) {
  const badge = root.querySelector(".connection");
  if (!badge) return;
  badge.dataset.state = state;
  badge.textContent = detail || state;
}

// Tell other scripts on the page (and tests) what arrived; drawnAt is after the charts took it.
function announce(name, detail) {
  const drawnAt = performance.timeOrigin + performance.now();
  document.dispatchEvent(new CustomEvent(name, {detail: {...detail, drawnAt}}));
}

// Follow one run: feed its socket's messages to a grid; announce what arrived on `document`.
// `onMessage` also gets every message (the run page's summary beside the charts).
export function followRun(grid, runId, {onStatus, onMessage, params} = {}) {
  const stream = new RunStream(runId, {
    params,
    onState: (state, detail) => showConnection(grid.root, state, detail),
    onMessage: (message, receivedAt) => {
      if (message.progress) showProgress(runId, message.progress);
      if (onMessage) onMessage(message);
      if (message.type === "backlog") {
        grid.setSeries(runId, message.panels, message.series, message.last_step);
        announce("run-live:backlog", {runId, complete: message.complete, receivedAt});
      } else if (message.type === "metrics") {
        grid.appendPoints(runId, message.panels, message.points);
        announce("run-live:metrics", {runId, steps: message.points.map((p) => p.step), receivedAt});
      } else if (message.type === "status") {
        if (onStatus) onStatus(message.run);
        announce("run-live:status", {runId, run: message.run, receivedAt});
      } else if (message.type === "samples") {
        const note = grid.root.querySelector(".samples-note");
        if (note) {
          const mean = formatMetric(message.reward_mean);
          note.textContent = `new samples: step ${message.step} (${message.split}, ${message.count}, mean reward ${mean})`;
        }
        announce("run-live:samples", {runId, ...message});
      }
    },
  });
  stream.open();
  return stream;
}

function start() {
  const root = document.getElementById("run-live");
  if (!root || !root.querySelector(".chart-grid")) return;
  const runId = Number(root.dataset.runId);
  const grid = new ChartGrid(root, {
    sources: [{id: runId, label: `run ${runId}`, store: new SeriesStore()}],
    seriesUrl: () => root.dataset.seriesUrl,
    pngName: `run-${runId}`,
  });
  window.postTrainCharts = grid;
  const summary = document.getElementById("run-summary") ? new RunSummary(document) : null;
  const health = document.getElementById("run-health") ? new RunHealth(document) : null;
  const log = document.getElementById("run-log") ? new RunLog(document.getElementById("run-log")) : null;
  window.postTrainLog = log;
  const checkpoints = document.getElementById("run-checkpoints") ? new RunCheckpoints(document.getElementById("run-checkpoints")) : null;
  window.postTrainStream = followRun(grid, runId, {
    params: () => (log ? log.params() : {}),
    onStatus: (run) => {
      root.dataset.status = run.status;
    },
    onMessage: (message) => {
      summary?.take(message);
      health?.take(message);
      log?.take(message);
      checkpoints?.take(message);
    },
  });
}

start();
