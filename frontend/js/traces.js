// Plotly traces from metric series, as pure functions: series in, trace objects out (no DOM, no
// Plotly), so the browser tests call them on hand-made input. charts.js draws what they return.
import {colourAt} from "./palette.js";
import {emaNext, emaStart} from "./stream.js";

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
export function panelTraces({sources, names, smoothing = 0, x = "step", type = "scatter"}) {
  const traces = [];
  const index = [];
  const ema = new Map();
  for (const src of sources) {
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
        ema.set(`${src.id}:${name}`, state);
        traces.push({
          type, mode: "lines", name: label, x: xs.slice(), y, line,
          legendgroup: `${src.id}:${name}`, hoverinfo: "skip",
        });
        index.push({source: src.id, name, smoothed: true, drawn: s.step.length});
      }
    }
  }
  return {traces, index, ema};
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
