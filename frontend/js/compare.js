// Run comparison: the same metric panels with one colour per run, each run on its own socket,
// so the live ones keep moving. Panels are the union of every run's metric names, or the panel
// keys the section's data-panels lists (the sweep page overlays the reward only).
//
// A run group (data-compare-group) is drawn as its mean in a band, from the server's band series
// (webapp/runs/bands.py): the score series first, then the rest. While members run, the page
// follows each running member's socket from its last step (no backlog) and, when a member
// records steps, fetches the band again from the oldest step a running member may still change,
// at most once every GROUP_RELOAD_MS: the band of a step changes as each member reaches it, so
// it is recomputed on the server rather than patched here.
import {ChartGrid, RunStream, SeriesStore, followRun, showConnection} from "./charts.js";
import {colourAt} from "./palette.js";
import {emptySeries, mergeRange} from "./stream.js";

const GROUP_RELOAD_MS = 2000;
const ACTIVE = new Set(["queued", "starting", "running"]);
const HEADLINE = ["critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean", "critic/rewards/max", "critic/rewards/min"];

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
  const groups = [...root.querySelectorAll("[data-compare-group]")].map((node, i) => {
    const runIds = node.dataset.runs.split(",").filter(Boolean).map(Number);
    return {
      id: `group:${node.dataset.compareGroup}`,
      label: node.dataset.label,
      color: colourAt(runs.length + i),
      store: new SeriesStore(),
      band: true,
      members: node.dataset.members,
      count: runIds.length,
      runIds,
      seriesUrl: root.dataset.groupSeriesUrl,
      seriesParams: runIds.map((id) => ["run", id]),
      node,
    };
  });
  for (const group of groups) {
    const swatch = group.node.querySelector(".swatch");
    if (swatch) swatch.style.background = group.color;
  }
  const only = root.dataset.panels ? new Set(root.dataset.panels.split(",")) : null;
  const grid = new ChartGrid(root, {
    sources: [...runs, ...groups],
    seriesUrl: (id) => root.dataset.seriesUrlTemplate.replace("/0/", `/${id}/`),
    pngName: `compare-${runs.map((r) => r.id).join("-")}`,
  });
  if (only) {
    // Panels outside the list are never added, so their series are never drawn.
    const addPanels = grid.addPanels.bind(grid);
    grid.addPanels = (panels) => addPanels(panels.filter((p) => only.has(p.key)));
  }
  window.postTrainCharts = grid;
  const band = root.querySelector("[name=band]");
  if (band) band.addEventListener("change", () => { grid.options.band = band.value; grid.redrawAll(); });
  for (const group of groups) followGroup(grid, group, {alone: !runs.length});
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

// Draw a group's band (the score first), then follow its running members' sockets.
async function followGroup(grid, group, {alone}) {
  const load = async (names, from = null) => {
    const result = await grid.fetchSeries(group.id, names, from, null);
    let series = result.series;
    if (from !== null) {
      // Steps before `from` are final: merge the new tail into what the page holds.
      series = {};
      for (const [name, tail] of Object.entries(result.series)) {
        series[name] = mergeRange(group.store.get(name) || emptySeries(), tail, from, Infinity);
      }
    }
    grid.setSeries(group.id, result.panels, series, result.last_step);
    document.dispatchEvent(new CustomEvent("run-live:group", {detail: {group: group.id, last_step: result.last_step}}));
    return result;
  };
  try {
    await load(HEADLINE);
    await load([]);
    if (alone) showConnection(grid.root, "live");
  } catch (error) {
    console.warn(error);
    if (alone) showConnection(grid.root, "reconnecting", "could not read the group");
  }
  // The band of a step is final once every running member is past it: each refresh reads from
  // the oldest last step a running member had at the previous one.
  const running = new Map(); // member id -> its last step, while it runs
  for (const member of (group.node.dataset.active || "").split(",").filter(Boolean)) {
    const [id, step] = member.split(":").map(Number);
    running.set(id, step);
  }
  let from = running.size ? Math.min(...running.values()) + 1 : null;
  let timer = null;
  const reload = () => {
    if (timer) return;
    timer = setTimeout(async () => {
      const next = running.size ? Math.min(...running.values()) + 1 : null;
      try {
        await load([], from);
        from = next;
      } catch (error) {
        console.warn(error);
      } finally {
        timer = null;
      }
    }, GROUP_RELOAD_MS);
  };
  for (const id of [...running.keys()]) {
    const stream = new RunStream(id, {
      since: running.get(id),
      onMessage: (message) => {
        if (message.type === "metrics" && message.points.length) {
          if (running.has(id)) running.set(id, message.points[message.points.length - 1].step);
          reload();
        } else if (message.type === "status") {
          if (!ACTIVE.has(message.run.status)) running.delete(id);
          reload();
        }
      },
    });
    stream.open();
  }
}

start();
