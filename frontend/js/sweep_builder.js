// The builder's sweep marks: a "sweep" button beside each config field adds its key, with the
// value the field holds now, to the sweep's keys (YAML, one "dotted.key: [values]" line per key)
// or takes it out again. The server reads only the text: editing it by hand works the same.

import {element} from "./dom.js";

function keyLine(text, key) {
  return text.split("\n").findIndex((line) => line.startsWith(`${key}:`));
}

// A value as a YAML flow item: numbers and plain words bare, anything else quoted.
function yamlItem(value) {
  if (value === "") return "null";
  return /^[\w.+-]+$/.test(value) ? value : JSON.stringify(value);
}

function start() {
  const form = document.getElementById("builder-form");
  const params = document.getElementById("id_sweep-params");
  const section = document.getElementById("sweep-builder");
  if (!form || !params || !section) return;
  const fields = form.querySelectorAll(".grid .field[data-field]");
  for (const field of fields) {
    if (section.contains(field)) continue;
    const input = field.querySelector("input:not([type=checkbox]), select");
    const label = field.querySelector("label");
    if (!input || !label) continue;
    const key = field.dataset.field.replaceAll("__", ".");
    const button = element("button", {
      type: "button", class: "sweep-mark", "data-sweep-key": key, "aria-pressed": "false",
      title: `Sweep ${key}`, text: "sweep",
    });
    const sync = () => button.setAttribute("aria-pressed", String(keyLine(params.value, key) >= 0));
    button.addEventListener("click", () => {
      const lines = params.value.split("\n").filter((line) => line.trim());
      const at = keyLine(lines.join("\n"), key);
      if (at >= 0) lines.splice(at, 1);
      else lines.push(`${key}: [${yamlItem(input.value.trim())}]`);
      params.value = lines.join("\n");
      section.open = true;
      for (const other of form.querySelectorAll(".sweep-mark")) other.dispatchEvent(new Event("sync"));
    });
    button.addEventListener("sync", sync);
    sync();
    label.after(button);
  }
  params.addEventListener("input", () => {
    for (const button of form.querySelectorAll(".sweep-mark")) button.dispatchEvent(new Event("sync"));
  });
}

start();
