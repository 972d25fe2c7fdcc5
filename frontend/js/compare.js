// Run comparison: the same metric panels with one colour per run, each run on its own socket,
// so the live ones keep moving. Panels are the union of every run's metric names, or the panel
// keys the section's data-panels lists (the sweep page overlays the reward only).
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
  const only = root.dataset.panels ? new Set(root.dataset.panels.split(",")) : null;
  const grid = new ChartGrid(root, {
    sources: runs,
    seriesUrl: (id) => root.dataset.seriesUrlTemplate.replace("/0/", `/${id}/`),
    pngName: `compare-${runs.map((r) => r.id).join("-")}`,
  });
  if (only) {
    // Panels outside the list are never added, so their series are never drawn.
    const addPanels = grid.addPanels.bind(grid);
    grid.addPanels = (panels) => addPanels(panels.filter((p) => only.has(p.key)));
  }
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
