// The run page's health alerts (webapp.health), kept live from the run's socket: a `health`
// message carries the alert [{check, label, step, message}] of a check that just fired; the
// last backlog message (and the status message of a reconnect) carries every stored one as
// `health`. The server renders the first paint; an alert already shown (same check) is not
// added twice, since a check fires once per run.

import {element} from "./dom.js";

export class RunHealth {
  constructor(doc = document) {
    this.root = doc.getElementById("run-health");
    this.list = this.root.querySelector(".health-alerts");
  }

  take(message) {
    const alerts = message.type === "health" ? message.alerts : message.health || [];
    for (const alert of alerts) this.show(alert);
  }

  show(alert) {
    const shown = [...this.list.children].some((item) => item.dataset.check === alert.check);
    if (shown) return;
    this.list.append(
      element("li", {class: "health-alert", "data-check": alert.check}, [
        element("span", {class: "health-badge", title: alert.message, text: alert.label}),
        " ",
        element("span", {class: "muted", text: `step ${alert.step}`}),
        ` ${alert.message}`,
      ]),
    );
    this.root.hidden = false;
  }
}
