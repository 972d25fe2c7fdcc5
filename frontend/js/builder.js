// Experiment builder: keep the YAML preview and the validator's errors in step with the form.
// The server renders the YAML through the engine (one validator); this only posts the form.
(function () {
  "use strict";
  const form = document.getElementById("builder-form");
  const preview = document.getElementById("yaml-preview");
  const warnings = document.getElementById("yaml-warnings");
  if (!form || !preview) return;
  let timer = null;
  let pending = null;

  function showErrors(errors) {
    form.querySelectorAll("[data-errors-for]").forEach(function (list) {
      const messages = errors[list.dataset.errorsFor] || [];
      list.replaceChildren.apply(list, messages.map(function (text) {
        const item = document.createElement("li");
        item.textContent = text;
        return item;
      }));
      const field = list.closest("[data-field]");
      if (field) field.classList.toggle("has-error", messages.length > 0);
    });
  }

  function refresh() {
    if (pending) pending.abort();
    pending = new AbortController();
    fetch(form.dataset.previewUrl, {
      method: "POST", body: new FormData(form), signal: pending.signal,
      headers: {"X-Requested-With": "fetch"}, credentials: "same-origin",
    })
      .then(function (response) { return response.json(); })
      .then(function (data) {
        preview.textContent = data.yaml || "";
        warnings.replaceChildren.apply(warnings, (data.warnings || []).map(function (text) {
          const item = document.createElement("li");
          item.textContent = text;
          return item;
        }));
        showErrors(data.errors || {});
      })
      .catch(function (error) { if (error.name !== "AbortError") preview.textContent = String(error); });
  }

  function schedule() { clearTimeout(timer); timer = setTimeout(refresh, 300); }
  form.addEventListener("input", schedule);
  form.addEventListener("change", schedule);

  document.getElementById("yaml-download").addEventListener("click", function () {
    const blob = new Blob([preview.textContent], {type: "application/yaml"});
    const link = document.createElement("a");
    const name = (form.elements.name.value || "experiment").replace(/[^\w.-]+/g, "_");
    link.href = URL.createObjectURL(blob);
    link.download = name + ".yaml";
    link.click();
    URL.revokeObjectURL(link.href);
  });
  refresh();
})();
