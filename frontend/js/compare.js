// Run comparison: the same metric panels with one colour per run, each run on its own socket,
// so the live ones keep moving. Panels are the union of every run's metric names.
import {ChartGrid, SeriesStore, followRun} from "./charts.js";
import {colourAt} from "./palette.js";

function start() {
  const root = document.getElementById("compare-live");
  if (!root) return;
  const runs = [...root.querySelectorAll("[data-compare-run]")].map((node, i) => ({
    id: Number(node.dataset.compareRun),
    label: node.dataset.label,
    color: colourAt(i),
    store: new SeriesStore(),
    node,
  }));
  for (const run of runs) {
    const swatch = run.node.querySelector(".swatch");
    if (swatch) swatch.style.background = run.color;
  }
  const grid = new ChartGrid(root, {
    sources: runs,
    seriesUrl: (id) => root.dataset.seriesUrlTemplate.replace("/0/", `/${id}/`),
    pngName: `compare-${runs.map((r) => r.id).join("-")}`,
  });
  window.postTrainCharts = grid;
  for (const run of runs) {
    followRun(grid, run.id, {
      onStatus: (state) => {
        const badge = run.node.querySelector(".status");
        if (badge) {
          badge.className = `status status-${state.status}`;
          badge.textContent = state.status;
        }
      },
    });
  }
}

start();
