// A report's charts (webapp/reports): one chart per chosen metric, each run as a line and each
// group as its mean in a min-max band, from the JSON the page embeds (#report-data). A classic
// script, not a module, so the exported HTML file can inline it beside Plotly and open offline.
// The colours are the studio's palette (palette.js), the band drawn as bandTraces draws it.
(function () {
  const PALETTE = ["#d3542f", "#2f5bd3", "#1f8a4c", "#8e44ad", "#b7791f", "#0f8b8d", "#c2366b", "#5d6d7e", "#7a9a01", "#a0522d"];
  // Plotly reads tags in names and hover text: text typed by members goes in without any.
  const plain = (text) => String(text || "").replace(/[<>&]/g, "");

  function withAlpha(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
  }

  function traces(source, color, series) {
    const label = plain(source.label);
    if (!source.band) {
      return [{type: "scatter", mode: "lines", name: label, x: series.step, y: series.value, line: {width: 1.6, color}}];
    }
    const edge = {type: "scatter", mode: "lines", x: series.step, line: {width: 0, color}, hoverinfo: "skip", showlegend: false};
    const customdata = series.step.map((step, i) => [series.min[i], series.max[i], series.n[i]]);
    return [
      {...edge, name: `${label} (min)`, y: series.min},
      {...edge, name: `${label} (max)`, y: series.max, fill: "tonexty", fillcolor: withAlpha(color, 0.22)},
      {
        type: "scatter", mode: "lines", name: label, x: series.step, y: series.value, line: {width: 1.8, color}, customdata,
        hovertemplate: `${label}<br>step %{x}: mean %{y:.6g}<br>min %{customdata[0]:.6g} · max %{customdata[1]:.6g}`
          + `<br>%{customdata[2]} members: ${plain(source.members)}<extra></extra>`,
      },
    ];
  }

  function draw() {
    const data = document.getElementById("report-data");
    const root = document.getElementById("report-charts");
    if (!data || !root || typeof Plotly === "undefined") return;
    const payload = JSON.parse(data.textContent);
    for (const name of payload.metrics) {
      const chart = document.createElement("div");
      chart.className = "report-chart";
      chart.dataset.metric = name;
      root.appendChild(chart);
      const drawn = [];
      payload.sources.forEach((source, i) => {
        const series = source.series[name];
        if (series && series.step.length) drawn.push(...traces(source, PALETTE[i % PALETTE.length], series));
      });
      if (!drawn.length) {
        chart.textContent = `${name}: no run here recorded it.`;
        chart.classList.add("muted");
        continue;
      }
      const layout = {
        title: {text: plain(name), font: {size: 14}}, height: 320, margin: {l: 56, r: 16, t: 40, b: 40},
        xaxis: {title: {text: "step"}}, legend: {orientation: "h"}, hovermode: "closest",
      };
      Plotly.newPlot(chart, drawn, layout, {displaylogo: false, responsive: true});
    }
    root.dataset.drawn = "true";
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
