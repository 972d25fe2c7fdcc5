// Experiment builder: keep the YAML preview and the validator's errors in step with the form.
// The server renders the YAML through the engine (one validator); this only posts the form.
// The preview shows what differs from the preset (or the whole config, ticked); a value the
// engine could not read shows as typed with the reason, never as the default kept in its place.
import {element, listItems} from "./dom.js";

function start() {
  const form = document.getElementById("builder-form");
  const preview = document.getElementById("yaml-preview");
  const warnings = document.getElementById("yaml-warnings");
  const whole = document.getElementById("yaml-whole");
  if (!form || !preview) return;
  let timer = null;
  let pending = null;
  let last = {yaml: "", changes: ""};
  // Fields the page's notice already explains (a preset's folders this server lacks): their
  // errors wait until the member edits something.
  let quiet = new Set((form.dataset.quietFields || "").split(/\s+/).filter(Boolean));

  function showErrors(errors) {
    for (const list of form.querySelectorAll("[data-errors-for]")) {
      const name = list.dataset.errorsFor;
      const messages = quiet.has(name) ? [] : errors[name] || [];
      list.replaceChildren(...listItems(messages));
      const field = list.closest("[data-field]");
      if (field) field.classList.toggle("has-error", messages.length > 0);
    }
  }

  function showYaml() {
    preview.textContent = (whole && whole.checked ? last.yaml : last.changes) || last.yaml;
  }

  async function refresh() {
    if (pending) pending.abort();
    pending = new AbortController();
    try {
      const response = await fetch(form.dataset.previewUrl, {
        method: "POST", body: new FormData(form), signal: pending.signal,
        headers: {"X-Requested-With": "fetch"}, credentials: "same-origin",
      });
      const data = await response.json();
      last = {yaml: data.yaml || "", changes: data.changes || ""};
      showYaml();
      warnings.replaceChildren(...listItems(data.warnings || []));
      showErrors(data.errors || {});
    } catch (error) {
      if (error.name !== "AbortError") preview.textContent = String(error);
    }
  }

  function schedule() {
    quiet = new Set();
    clearTimeout(timer);
    timer = setTimeout(refresh, 300);
  }
  form.addEventListener("input", schedule);
  form.addEventListener("change", schedule);
  if (whole) whole.addEventListener("change", showYaml);

  // A dataset picked shows its path in data.train_files / data.val_files; a path typed there
  // that is not the picked dataset's un-picks it, so the fields always say what the run reads.
  for (const picker of form.querySelectorAll("select[data-sets]")) {
    const input = form.elements[picker.dataset.sets];
    if (!input) continue;
    picker.addEventListener("change", () => {
      const path = picker.selectedOptions[0] && picker.selectedOptions[0].dataset.path;
      if (path) input.value = path;
    });
    input.addEventListener("input", () => {
      const path = picker.selectedOptions[0] && picker.selectedOptions[0].dataset.path;
      if (path && input.value.trim() !== path) picker.value = "";
    });
  }

  // The fully-async mode's staleness boxes show only while that mode is picked (the server
  // writes them in that mode only).
  const staleness = document.getElementById("staleness-settings");
  if (staleness) {
    const showStaleness = () => {
      const mode = form.querySelector("input[name=training_mode]:checked");
      staleness.hidden = !mode || mode.value !== staleness.dataset.shownFor;
    };
    form.addEventListener("change", showStaleness);
    showStaleness();
  }

  document.getElementById("yaml-download").addEventListener("click", () => {
    const blob = new Blob([last.yaml], {type: "application/yaml"});
    const name = (form.elements.name.value || "experiment").replace(/[^\w.-]+/g, "_");
    const link = element("a", {href: URL.createObjectURL(blob), download: `${name}.yaml`});
    link.click();
    URL.revokeObjectURL(link.href);
  });

  // After a refused submit: the summary at the top takes the focus, so the errors are seen.
  const summary = document.getElementById("error-summary");
  if (summary) {
    summary.scrollIntoView({block: "start"});
    summary.focus();
  }
  refresh();
}

start();
