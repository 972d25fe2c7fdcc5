// The run page's checkpoints section (its list, download links, evaluations), rendered by the
// server and read again when it changes: the run saved a checkpoint (a new latest_checkpoint in
// the run's state, which status and metrics messages carry) or a job on one moved (the socket's
// `checkpoints` message). A form being filled in is not replaced under the reader's hands: the
// section is read again once the focus leaves it.

export class RunCheckpoints {
  constructor(root) {
    this.root = root;
    this.url = root.dataset.fragmentUrl;
    this.latest = undefined;
    this.stale = false;
    root.addEventListener("focusout", () => setTimeout(() => this.stale && this.refresh(), 0));
  }

  take(message) {
    const latest = message.run ? message.run.latest_checkpoint : undefined;
    const moved = latest !== undefined && this.latest !== undefined && latest !== this.latest;
    if (latest !== undefined) this.latest = latest;
    if (message.type === "checkpoints" || moved) this.refresh();
  }

  async refresh() {
    if (this.root.contains(document.activeElement) && document.activeElement !== document.body) {
      this.stale = true;
      return;
    }
    this.stale = false;
    try {
      const response = await fetch(this.url, {credentials: "same-origin"});
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const section = page.getElementById("run-checkpoints");
      if (section) this.root.replaceChildren(...section.childNodes);
      document.dispatchEvent(new CustomEvent("run-checkpoints:refreshed"));
    } catch (error) {
      console.warn(error);
    }
  }
}
