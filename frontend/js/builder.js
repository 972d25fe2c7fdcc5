// Experiment builder: keep the YAML preview and the validator's errors in step with the form.
// The server renders the YAML through the engine (one validator); this only posts the form.
import {element, listItems} from "./dom.js";

function start() {
  const form = document.getElementById("builder-form");
  const preview = document.getElementById("yaml-preview");
  const warnings = document.getElementById("yaml-warnings");
  if (!form || !preview) return;
  let timer = null;
  let pending = null;

  function showErrors(errors) {
    for (const list of form.querySelectorAll("[data-errors-for]")) {
      const messages = errors[list.dataset.errorsFor] || [];
      list.replaceChildren(...listItems(messages));
      const field = list.closest("[data-field]");
      if (field) field.classList.toggle("has-error", messages.length > 0);
    }
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
      preview.textContent = data.yaml || "";
      warnings.replaceChildren(...listItems(data.warnings || []));
      showErrors(data.errors || {});
    } catch (error) {
      if (error.name !== "AbortError") preview.textContent = String(error);
    }
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 300);
  }
  form.addEventListener("input", schedule);
  form.addEventListener("change", schedule);

  document.getElementById("yaml-download").addEventListener("click", () => {
    const blob = new Blob([preview.textContent], {type: "application/yaml"});
    const name = (form.elements.name.value || "experiment").replace(/[^\w.-]+/g, "_");
    const link = element("a", {href: URL.createObjectURL(blob), download: `${name}.yaml`});
    link.click();
    URL.revokeObjectURL(link.href);
  });
  refresh();
}

start();
