// The sweep page follows its members as the run page follows its run. The server's state of the
// sweep (webapp.sweeps.selectors.sweep_state: its status, strategy, best member and active count,
// each member's status, progress, headline metrics and pruning reason, the parallel-coordinates
// figure) is embedded for the first paint
// and read again from state.json whenever a member's socket (compare.js opens one per overlay
// member) reports a status or a step, and every POLL_MS while the sweep runs, for members past
// the overlay. Nothing here computes a value: it puts the state where the page shows it.
import {showProgress} from "./charts.js";
import {readJson} from "./dom.js";

const REFRESH_DELAY_MS = 250; // the events of one step (metrics, status) cost one read
const POLL_MS = 10000;
const HEADLINES = {
  reward_final: "reward-final",
  reward_best: "reward-best",
  validation_final: "validation-final",
  validation_best: "validation-best",
  objective_final: "objective-final",
};
const PARCOORDS_LAYOUT = {margin: {l: 80, r: 40, t: 40, b: 20}, height: 360, font: {family: "system-ui, sans-serif", size: 11}};

function showStatus(badge, status) {
  if (!badge) return;
  badge.className = `status status-${status}`;
  badge.textContent = status;
}

export class SweepPage {
  constructor(root) {
    this.root = root;
    this.url = root.dataset.stateUrl;
    this.drawn = null; // the figure on screen, as JSON
    this.show(readJson("sweep-state"));
    for (const name of ["run-live:status", "run-live:metrics"]) document.addEventListener(name, () => this.soon());
    this.timer = setInterval(() => {
      if (this.state.status === "running") this.soon();
    }, POLL_MS);
    if (!window.Plotly) window.addEventListener("DOMContentLoaded", () => this.draw(this.state.parcoords));
  }

  field(name) {
    return this.root.querySelector(`[data-sweep-field="${name}"]`);
  }

  soon() {
    if (this.waiting) return;
    this.waiting = setTimeout(() => {
      this.waiting = null;
      this.refresh();
    }, REFRESH_DELAY_MS);
  }

  async refresh() {
    if (this.fetching) {
      this.again = true; // one more read once this one is in: it may predate the event
      return;
    }
    this.fetching = true;
    try {
      const response = await fetch(this.url, {credentials: "same-origin"});
      if (response.ok) this.show(await response.json());
    } catch (error) {
      console.warn(error);
    } finally {
      this.fetching = false;
      if (this.again) {
        this.again = false;
        this.soon();
      }
    }
  }

  show(state) {
    this.state = state;
    showStatus(this.field("status").querySelector(".status"), state.status);
    const active = this.field("active");
    active.hidden = !state.active_count;
    active.textContent = ` · ${state.active_count} active`;
    this.field("cancel").hidden = state.status !== "running";
    this.field("strategy").textContent = state.strategy;
    this.field("count").textContent = state.members.length;
    const stop = this.field("stop-reason");
    stop.hidden = !state.stop_reason;
    stop.textContent = state.stop_reason;
    const best = this.field("best-text");
    if (best && state.best) {
      const link = document.createElement("a");
      link.href = state.best.url;
      link.textContent = `#${state.best.index}`;
      best.replaceChildren(link, `, ${state.objective.metric} = ${state.best.value.text}`);
    }
    let unseen = 0;
    for (const member of state.members) {
      const row = this.root.querySelector(`tr[data-member="${member.index}"]`);
      if (!row) {
        unseen += 1; // a member the search launched after this page was drawn
        continue;
      }
      showStatus(row.querySelector("[data-cell=status] .status"), member.pruned ? "pruned" : member.status);
      const pruned = row.querySelector("[data-cell=pruned]");
      if (pruned) pruned.textContent = member.pruned ? member.pruned.text : "";
      for (const [key, metric] of Object.entries(HEADLINES)) {
        const cell = row.querySelector(`[data-metric="${metric}"]`);
        if (cell) cell.textContent = member[key].text;
      }
      showProgress(member.run_id, member.progress);
    }
    this.field("new-members").hidden = unseen === 0;
    this.draw(state.parcoords);
    document.dispatchEvent(new CustomEvent("sweep:state", {detail: state}));
  }

  // The chart appears with the first member's reward and changes only when its figure does.
  draw(figure) {
    const node = document.getElementById("sweep-parcoords");
    const lines = figure.members.length > 0;
    node.hidden = !lines;
    this.field("parcoords-note").hidden = lines;
    const text = JSON.stringify(figure);
    if (!lines || !window.Plotly || text === this.drawn) return;
    this.drawn = text;
    Plotly.react(node, figure.data, PARCOORDS_LAYOUT, {responsive: true, displaylogo: false});
  }
}

const root = document.getElementById("sweep-page");
if (root) window.postTrainSweep = new SweepPage(root);
