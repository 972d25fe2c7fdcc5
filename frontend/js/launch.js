// Launch and resume forms (`form[data-busy-label]`): one click sends one POST. On submit the
// button is disabled and shows the busy label; the form's hidden launch_key also makes the
// server answer a repeated POST with the run the first one made.

const forms = document.querySelectorAll("form[data-busy-label]");

// A key like the server's secrets.token_urlsafe(24): 32 URL-safe base64 characters.
function newLaunchKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(24));
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_");
}

for (const form of forms) {
  const button = form.querySelector("button[type=submit]");
  form.addEventListener("submit", (event) => {
    if (form.dataset.submitted) {
      event.preventDefault();
      return;
    }
    form.dataset.submitted = "1";
    button.dataset.label = button.textContent;
    button.disabled = true;
    button.textContent = form.dataset.busyLabel;
  });
}

// Back to a page the browser kept in its cache: the user means another launch, so the button
// comes back with a new key (the old one would lead to the run it already made).
window.addEventListener("pageshow", (event) => {
  if (!event.persisted) return;
  for (const form of forms) {
    if (!form.dataset.submitted) continue;
    const button = form.querySelector("button[type=submit]");
    delete form.dataset.submitted;
    button.disabled = false;
    button.textContent = button.dataset.label;
    form.elements.launch_key.value = newLaunchKey();
  }
});
