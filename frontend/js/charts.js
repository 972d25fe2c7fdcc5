// Live charts of a run: one WebSocket per run, a grid of Plotly panels built from the metric
// names the server reports, updated in place (extendTraces) as each step lands.
//
// The server sends each series already downsampled (min/max buckets, ~1,500 points); zooming
// asks it for the visible step range at the same budget and merges the finer points in.
// Smoothing is TensorBoard's debiased exponential moving average, drawn over the faint raw line;
// hover always reads the raw values. Panels with many points switch to WebGL (scattergl) when the
// browser has it. After a drop the socket reconnects with ?since=<last step> and gets exactly the
// steps it missed. compare.js reuses RunStream and ChartGrid to overlay several runs.

const WEBGL_POINTS = 4000; // points in one panel above which WebGL draws faster than SVG
const REFRESH_POINTS = 3000; // a live series this long is fetched again, downsampled
const RECONNECT_MAX_MS = 10000;
const PALETTE = ["#d3542f", "#2f5bd3", "#1f8a4c", "#8e44ad", "#b7791f", "#0f8b8d", "#c2366b", "#5d6d7e", "#7a9a01", "#a0522d"];
const REFUSED = {4401: "Sign in again to follow this run.", 4403: "This run is not yours."};

export const hasWebGL = (() => {
  try {
    const canvas = document.createElement("canvas");
    return Boolean(canvas.getContext("webgl2") || canvas.getContext("webgl"));
  } catch (error) {
    return false;
  }
})();

// TensorBoard's smoothing: an EMA divided by (1 - weight^n) so the start is not pulled to zero.
export function emaStart() {
  return {acc: 0, n: 0};
}

export function emaNext(state, value, weight) {
  state.acc = state.acc * weight + (1 - weight) * value;
  state.n += 1;
  if (weight === 0) return value;
  // 12 digits: the debiasing leaves rounding noise that autoscaling would blow up on a flat line.
  return Number((state.acc / (1 - Math.pow(weight, state.n))).toPrecision(12));
}

export function ema(values, weight) {
  const state = emaStart();
  return values.map((v) => emaNext(state, v, weight));
}

function finite(value) {
  return typeof value === "number" && Number.isFinite(value);
}

function emptySeries() {
  return {step: [], time: [], value: []};
}

// Points of `coarse` outside [lo, hi] and every point of `fine` (inside), in step order.
export function mergeRange(coarse, fine, lo, hi) {
  const out = emptySeries();
  const push = (s, i) => {
    out.step.push(s.step[i]);
    out.time.push(s.time[i]);
    out.value.push(s.value[i]);
  };
  let j = 0;
  for (let i = 0; i < coarse.step.length; i++) {
    const step = coarse.step[i];
    if (step >= lo && step <= hi) continue;
    while (step > hi && j < fine.step.length) push(fine, j++);
    push(coarse, i);
  }
  while (j < fine.step.length) push(fine, j++);
  return out;
}

// One run's series as the page knows them: {name: {step, time, value}} and the last step seen.
export class SeriesStore {
  constructor() {
    this.series = new Map();
    this.lastStep = null;
  }

  get(name) {
    return this.series.get(name);
  }

  replace(seriesByName, lastStep) {
    for (const [name, s] of Object.entries(seriesByName)) this.series.set(name, s);
    if (lastStep !== null && lastStep !== undefined) this.lastStep = Math.max(this.lastStep ?? lastStep, lastStep);
  }

  // Append live points; return [{name, step, time, value}] for those after the last step seen.
  append(points) {
    const added = [];
    for (const point of points) {
      if (this.lastStep !== null && point.step <= this.lastStep) continue;
      this.lastStep = point.step;
      for (const [name, value] of Object.entries(point.metrics)) {
        if (!finite(value)) continue;
        if (!this.series.has(name)) this.series.set(name, emptySeries());
        const s = this.series.get(name);
        s.step.push(point.step);
        s.time.push(point.time);
        s.value.push(value);
        added.push({name, step: point.step, time: point.time, value});
      }
    }
    return added;
  }
}

// A WebSocket to /ws/runs/<id>/ that reconnects with the last step it saw.
export class RunStream {
  constructor(runId, {onMessage, onState}) {
    this.runId = runId;
    this.onMessage = onMessage;
    this.onState = onState || (() => {});
    this.lastStep = null;
    this.hasBacklog = false;
    this.delay = 500;
    this.closed = false;
  }

  url() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const since = this.hasBacklog && this.lastStep !== null ? `?since=${this.lastStep}` : "";
    return `${scheme}://${location.host}/ws/runs/${this.runId}/${since}`;
  }

  open() {
    this.onState(this.hasBacklog ? "reconnecting" : "connecting");
    const socket = new WebSocket(this.url());
    this.socket = socket;
    socket.onopen = () => {
      this.delay = 500;
      this.onState("live");
    };
    socket.onmessage = (event) => {
      const receivedAt = performance.timeOrigin + performance.now();
      const message = JSON.parse(event.data);
      if (message.type === "backlog") {
        this.hasBacklog = true;
        if (message.last_step !== null) this.lastStep = Math.max(this.lastStep ?? 0, message.last_step);
      } else if (message.type === "metrics" && message.points.length) {
        this.lastStep = Math.max(this.lastStep ?? 0, message.points[message.points.length - 1].step);
      }
      this.onMessage(message, receivedAt);
    };
    socket.onclose = (event) => {
      if (this.closed) return;
      if (REFUSED[event.code]) {
        this.closed = true;
        this.onState("refused", REFUSED[event.code]);
        return;
      }
      this.onState("offline");
      setTimeout(() => this.open(), this.delay);
      this.delay = Math.min(this.delay * 2, RECONNECT_MAX_MS);
    };
  }

  close() {
    this.closed = true;
    if (this.socket) this.socket.close();
  }
}

function element(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

function shortName(name, panelNames) {
  if (panelNames.length === 1) return name;
  const prefix = name.split("/").slice(0, -1).join("/");
  const shared = panelNames.every((n) => n.startsWith(prefix + "/"));
  return shared && prefix ? name.slice(prefix.length + 1) : name;
}

// A grid of panels over one or more runs ("sources"), each with its own SeriesStore.
export class ChartGrid {
  constructor(root, {sources, seriesUrl, pngName}) {
    this.root = root;
    this.grid = root.querySelector(".chart-grid");
    this.sources = sources; // [{id, label, color, store}]
    this.seriesUrl = seriesUrl; // (sourceId) => URL of the zoom-refinement endpoint
    this.pngName = pngName || "chart";
    this.panels = new Map();
    this.options = {smoothing: 0.6, x: "step", log: false};
    this.pending = new Set();
    this.drawn = false;
    this.bindToolbar(root.querySelector(".chart-toolbar"));
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
        panel = {key: p.key, title: p.title, order: p.order, names: [], figure, plot, traces: [], ema: new Map()};
        png.addEventListener("click", () => this.downloadPng(panel));
        const after = [...this.panels.values()].filter((q) => q.order < p.order || (q.order === p.order && q.key < p.key));
        const before = [...this.grid.children].find((node) => !after.some((q) => q.figure === node));
        this.grid.insertBefore(figure, before || null);
        this.panels.set(p.key, panel);
      }
      for (const name of p.names) if (!panel.names.includes(name)) panel.names.push(name);
      panel.names.sort();
    }
  }

  panelOf(name) {
    for (const panel of this.panels.values()) if (panel.names.includes(name)) return panel;
    return null;
  }

  buildTraces(panel) {
    const traces = [];
    const index = [];
    const smoothing = this.options.smoothing;
    const total = this.sources.reduce((sum, src) => sum + panel.names.reduce((n, name) => n + (src.store.get(name)?.step.length || 0), 0), 0);
    const type = hasWebGL && total > WEBGL_POINTS ? "scattergl" : "scatter";
    panel.ema = new Map();
    for (const src of this.sources) {
      for (const [k, name] of panel.names.entries()) {
        const s = src.store.get(name);
        if (!s || !s.step.length) continue;
        const x = this.options.x === "time" ? s.time.map((t) => t * 1000) : s.step.slice();
        const label = (this.sources.length > 1 ? `${src.label} · ` : "") + shortName(name, panel.names);
        const extreme = /\/(max|min)$/.test(name);
        const color = src.color || PALETTE[k % PALETTE.length];
        const line = {width: extreme ? 1 : 1.6, dash: extreme ? "dot" : "solid", color};
        const raw = {
          type, mode: "lines", name: label, x, y: s.value.slice(), line: {...line},
          legendgroup: `${src.id}:${name}`,
          customdata: s.step.slice(),
          hovertemplate: `${label}<br>step %{customdata}: %{y:.10g}<extra></extra>`,
        };
        if (smoothing > 0) {
          raw.opacity = 0.3;
          raw.showlegend = false;
        }
        traces.push(raw);
        index.push({source: src.id, name, smoothed: false});
        if (smoothing > 0) {
          const state = emaStart();
          const y = s.value.map((v) => emaNext(state, v, smoothing));
          panel.ema.set(`${src.id}:${name}`, state);
          traces.push({
            type, mode: "lines", name: label, x: x.slice(), y, line,
            legendgroup: `${src.id}:${name}`, hoverinfo: "skip",
          });
          index.push({source: src.id, name, smoothed: true});
        }
      }
    }
    panel.type = type;
    return {traces, index};
  }

  layout(panel) {
    const time = this.options.x === "time";
    return {
      margin: {l: 56, r: 12, t: 8, b: 36},
      height: 250,
      showlegend: true,
      legend: {orientation: "h", y: -0.22, font: {size: 11}},
      hovermode: "closest",
      xaxis: {type: time ? "date" : "linear", title: {text: time ? "wall time" : "step", standoff: 4}, automargin: true},
      yaxis: {type: this.options.log ? "log" : "linear", exponentformat: "e", automargin: true},
      uirevision: `${this.options.x}:${this.options.log}`,
      font: {family: "system-ui, sans-serif", size: 11},
    };
  }

  draw(panel) {
    const {traces, index} = this.buildTraces(panel);
    panel.traces = index;
    const config = {responsive: true, displaylogo: false, toImageButtonOptions: {format: "png", filename: `${this.pngName}-${panel.key}`}};
    Plotly.react(panel.plot, traces, this.layout(panel), config);
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
    const keys = new Set(Object.keys(series).map((name) => this.panelOf(name)?.key).filter(Boolean));
    // The first chart is drawn now, not on the next frame: the page's first paint waits for it.
    for (const key of keys) this.draw(this.panels.get(key));
  }

  // Append live points in place (extendTraces); panels that gain a series are redrawn.
  appendPoints(sourceId, panels, points) {
    if (panels) this.addPanels(panels);
    const src = this.source(sourceId);
    const added = src.store.append(points);
    const smoothing = this.options.smoothing;
    const updates = new Map(); // panel key -> {x: [[]], y: [[]], indices: []}
    const stale = new Set();
    for (const point of added) {
      const panel = this.panelOf(point.name);
      if (!panel || stale.has(panel.key)) continue;
      const s = src.store.get(point.name);
      const exists = panel.traces.findIndex((t) => t.source === sourceId && t.name === point.name && !t.smoothed);
      if (exists < 0 || (panel.type === "scatter" && s.step.length > WEBGL_POINTS && hasWebGL)) {
        stale.add(panel.key);
        continue;
      }
      if (s.step.length > REFRESH_POINTS && !panel.refreshing) this.refresh(panel, sourceId);
      const x = this.options.x === "time" ? point.time * 1000 : point.step;
      const update = updates.get(panel.key) || {x: [], y: [], indices: []};
      const push = (traceIndex, y) => {
        let k = update.indices.indexOf(traceIndex);
        if (k < 0) {
          update.indices.push(traceIndex);
          update.x.push([]);
          update.y.push([]);
          k = update.indices.length - 1;
        }
        update.x[k].push(x);
        update.y[k].push(y);
      };
      push(exists, point.value);
      if (smoothing > 0) {
        const state = panel.ema.get(`${sourceId}:${point.name}`) || emaStart();
        panel.ema.set(`${sourceId}:${point.name}`, state);
        push(exists + 1, emaNext(state, point.value, smoothing));
      }
      updates.set(panel.key, update);
    }
    for (const [key, update] of updates) {
      if (stale.has(key)) continue;
      Plotly.extendTraces(this.panels.get(key).plot, {x: update.x, y: update.y}, update.indices);
    }
    this.redraw(stale);
  }

  async fetchSeries(sourceId, names, lo, hi) {
    const params = new URLSearchParams();
    for (const name of names) params.append("name", name);
    if (lo !== null) params.set("from", lo);
    if (hi !== null) params.set("to", hi);
    const response = await fetch(`${this.seriesUrl(sourceId)}?${params}`, {credentials: "same-origin"});
    if (!response.ok) throw new Error(`series request failed: ${response.status}`);
    return response.json();
  }

  // Zoom: fetch the visible step range of this panel's series and merge the finer points in.
  async refine(panel, event) {
    if (panel.refining || event["xaxis.range[0]"] === undefined) return;
    let lo = event["xaxis.range[0]"];
    let hi = event["xaxis.range[1]"];
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

// Follow one run: feed its socket's messages to a grid; announce what arrived on `document`.
export function followRun(grid, runId, {onStatus} = {}) {
  const stream = new RunStream(runId, {
    onState: (state, detail) => showConnection(grid.root, state, detail),
    onMessage: (message, receivedAt) => {
      if (message.progress) showProgress(runId, message.progress);
      if (message.type === "backlog") {
        grid.setSeries(runId, message.panels, message.series, message.last_step);
      } else if (message.type === "metrics") {
        grid.appendPoints(runId, message.panels, message.points);
        const steps = message.points.map((p) => p.step);
        document.dispatchEvent(new CustomEvent("run-live:metrics", {detail: {runId, steps, receivedAt}}));
      } else if (message.type === "status") {
        if (onStatus) onStatus(message.run);
      } else if (message.type === "samples") {
        const note = grid.root.querySelector(".samples-note");
        if (note) {
          const mean = message.reward_mean === null ? "—" : message.reward_mean.toFixed(3);
          note.textContent = `new samples: step ${message.step} (${message.split}, ${message.count}, mean reward ${mean})`;
        }
        document.dispatchEvent(new CustomEvent("run-live:samples", {detail: {runId, ...message}}));
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
  followRun(grid, runId, {
    onStatus: (run) => {
      root.dataset.status = run.status;
    },
  });
}

start();
