// Plotly traces from metric series, as pure functions: series in, trace objects out (no DOM, no
// Plotly), so the browser tests call them on hand-made input. charts.js draws what they return.
import {colourAt} from "./palette.js";
import {ema, emaNext, emaStart} from "./stream.js";

// A metric's name inside its panel: the part after a prefix every name of the panel shares.
export function shortName(name, panelNames) {
  if (panelNames.length === 1) return name;
  const prefix = name.split("/").slice(0, -1).join("/");
  const shared = panelNames.every((n) => n.startsWith(prefix + "/"));
  return shared && prefix ? name.slice(prefix.length + 1) : name;
}

// The x values of a series from point `from` on: steps, or wall times in ms for a date axis.
export function xValues(series, x, from = 0) {
  return x === "time" ? series.time.slice(from).map((t) => t * 1000) : series.step.slice(from);
}

function seriesOf(source, name) {
  const series = source.series;
  return series instanceof Map ? series.get(name) : series[name];
}

// The traces of one panel.
//   sources: [{id, label, color?, series: {name: {step, time, value}} or a Map}]
//   names: the panel's metric names; smoothing: the EMA weight (0: raw lines only);
//   x: "step" or "time"; type: "scatter" or "scattergl".
// Returns {traces, index, ema}: the Plotly traces; per trace {source, name, smoothed, drawn (its
// point count)}; per smoothed series ("<source id>:<name>") the EMA state to extend it from.
// Each series gets its raw line, faint under its smoothed line when smoothing > 0; a source
// without a colour of its own colours its series by their place in `names`.
// A run group's source (`band: true`, `members`: the text its hover lists) draws each series as
// its mean line in a band (bandTraces); `band` picks the band: "minmax" or "std".
export function panelTraces({sources, names, smoothing = 0, x = "step", type = "scatter", band = "minmax"}) {
  const traces = [];
  const index = [];
  const emas = new Map();
  for (const src of sources) {
    if (src.band) {
      for (const name of names) {
        const s = seriesOf(src, name);
        if (!s || !s.step.length) continue;
        for (const trace of bandTraces({src, name, names, series: s, smoothing, x, type, band})) {
          traces.push(trace);
          index.push({source: src.id, name, band: true, drawn: s.step.length});
        }
      }
      continue;
    }
    for (const [k, name] of names.entries()) {
      const s = seriesOf(src, name);
      if (!s || !s.step.length) continue;
      const xs = xValues(s, x);
      const label = (sources.length > 1 ? `${src.label} · ` : "") + shortName(name, names);
      const extreme = /\/(max|min)$/.test(name);
      const color = src.color || colourAt(k);
      const line = {width: extreme ? 1 : 1.6, dash: extreme ? "dot" : "solid", color};
      const raw = {
        type, mode: "lines", name: label, x: xs, y: s.value.slice(), line: {...line},
        legendgroup: `${src.id}:${name}`,
        customdata: s.step.slice(),
        hovertemplate: `${label}<br>step %{customdata}: %{y:.10g}<extra></extra>`,
      };
      if (smoothing > 0) {
        raw.opacity = 0.3;
        raw.showlegend = false;
      }
      traces.push(raw);
      index.push({source: src.id, name, smoothed: false, drawn: s.step.length});
      if (smoothing > 0) {
        const state = emaStart();
        const y = s.value.map((v) => emaNext(state, v, smoothing));
        emas.set(`${src.id}:${name}`, state);
        traces.push({
          type, mode: "lines", name: label, x: xs.slice(), y, line,
          legendgroup: `${src.id}:${name}`, hoverinfo: "skip",
        });
        index.push({source: src.id, name, smoothed: true, drawn: s.step.length});
      }
    }
  }
  return {traces, index, ema: emas};
}

// "#rrggbb" with an alpha: the band's fill.
export function withAlpha(hex, alpha) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
}

// The band's lower and upper curves: min and max, or mean - std and mean + std.
export function bandBounds(series, band = "minmax") {
  if (band === "std") {
    return [series.value.map((m, i) => m - series.std[i]), series.value.map((m, i) => m + series.std[i])];
  }
  return [series.min.slice(), series.max.slice()];
}

// A group's series as three traces: the lower curve (no line), the upper one filled down to it
// ("tonexty" fills to the trace just before), and the mean line, whose hover reads the raw mean,
// min, max, std and how many members recorded the step, and lists the members.
export function bandTraces({src, name, names, series, smoothing = 0, x = "step", type = "scatter", band = "minmax"}) {
  const xs = xValues(series, x);
  // Plotly reads tags in hover text: names typed by members go in without any.
  const label = `${src.label} · ${shortName(name, names)}`.replace(/[<>&]/g, "");
  const color = src.color || colourAt(0);
  const smooth = (values) => (smoothing > 0 ? ema(values, smoothing) : values);
  const [lower, upper] = bandBounds(series, band).map(smooth);
  const edge = {type, mode: "lines", x: xs, line: {width: 0, color}, hoverinfo: "skip", showlegend: false, legendgroup: `${src.id}:${name}`};
  const members = (src.members || "").replace(/[<>&]/g, "");  // run ids and seeds
  const customdata = series.step.map((step, i) => [step, series.value[i], series.min[i], series.max[i], series.std[i], series.n[i]]);
  const count = src.count || (series.n.length ? Math.max(...series.n) : 0);
  return [
    {...edge, name: `${label} (lower)`, y: lower},
    {...edge, name: `${label} (upper)`, y: upper, fill: "tonexty", fillcolor: withAlpha(color, 0.22)},
    {
      type, mode: "lines", name: label, x: xs.slice(), y: smooth(series.value.slice()), line: {width: 1.8, color},
      legendgroup: `${src.id}:${name}`, customdata,
      hovertemplate: `${label}<br>step %{customdata[0]}: mean %{customdata[1]:.6g}`
        + "<br>min %{customdata[2]:.6g} · max %{customdata[3]:.6g} · std %{customdata[4]:.4g}"
        + `<br>%{customdata[5]} of ${count} members: ${members}<extra></extra>`,
    },
  ];
}

// The lowest and highest finite value of a panel's traces ([lo, hi]; nulls when it has none), or
// of `span` extended by `values` when given: what flatRange reads. (A smoothed line stays within
// its raw values, so every trace may be read.)
export function valueSpan(traces, span = [null, null], values = null) {
  let [lo, hi] = span;
  const take = (v) => {
    if (typeof v !== "number" || !Number.isFinite(v)) return;
    lo = lo === null ? v : Math.min(lo, v);
    hi = hi === null ? v : Math.max(hi, v);
  };
  if (values) values.forEach(take);
  else for (const trace of traces) trace.y.forEach(take);
  return [lo, hi];
}

// The y range of a panel whose values are all one number, or null to let Plotly fit the axis.
// Plotly draws a constant series in the middle of [v - 1, v + 1]: a learning rate of 1e-6 was a
// flat line at 0 on a -1..1 axis. Here the axis spans half the value either side of it.
export function flatRange([lo, hi], log = false) {
  if (lo === null || lo !== hi || log) return null;
  const pad = lo === 0 ? 1 : Math.abs(lo) / 2;
  return [lo - pad, lo + pad];
}
