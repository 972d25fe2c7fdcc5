// The run's own log on its page: the driver's stdout and stderr as its socket sends them (the
// socket's `log` messages, webapp.runs.logs), a search over the whole log on the server, and the
// download link. The page holds at most MAX_LINES lines, the newest; the rest is in the download.
// Every line is set as text, never as HTML.
import {element} from "./dom.js";

export const MAX_LINES = 2000;

export class RunLog {
  constructor(root) {
    this.root = root;
    this.offset = null; // the byte the socket goes on from after a reconnect
    this.lines = [];
    this.dropped = 0; // lines the page let go of (MAX_LINES), or the server skipped
    this.skippedBytes = 0;
    this.text = this.field("text");
    this.field("search").addEventListener("submit", (event) => {
      event.preventDefault();
      this.search(new FormData(event.target).get("q"));
    });
  }

  field(name) {
    return this.root.querySelector(`[data-log-field="${name}"]`);
  }

  // The socket's query: the log's tail first, then from where this page stopped.
  params() {
    return {log: this.offset === null ? "" : this.offset};
  }

  take(message) {
    if (message.type !== "log") return;
    if (message.reset) {
      this.lines = [];
      this.dropped = 0;
      this.skippedBytes = 0;
    }
    this.skippedBytes += message.skipped || 0;
    const lines = message.text.split("\n");
    if (lines.length && lines[lines.length - 1] === "") lines.pop();
    this.lines.push(...lines);
    if (this.lines.length > MAX_LINES) {
      this.dropped += this.lines.length - MAX_LINES;
      this.lines.splice(0, this.lines.length - MAX_LINES);
    }
    this.offset = message.offset;
    this.show();
    document.dispatchEvent(new CustomEvent("run-log:lines", {detail: {count: lines.length, offset: this.offset}}));
  }

  show() {
    const box = this.text;
    const kept = box.scrollTop;
    box.textContent = this.lines.join("\n");
    box.hidden = this.lines.length === 0;
    this.field("empty").hidden = this.lines.length > 0;
    const parts = [`${this.lines.length} line${this.lines.length === 1 ? "" : "s"}`];
    if (this.dropped || this.skippedBytes) parts.push("the newest only: download the log for all of it");
    this.field("note").textContent = `(${parts.join("; ")})`;
    // Follow the end, or stay where the reader is (untick "follow" to read back).
    box.scrollTop = this.field("follow").checked ? box.scrollHeight : kept;
  }

  async search(query) {
    const list = this.field("matches");
    const status = this.field("search-status");
    if (!query || !query.trim()) {
      list.replaceChildren();
      list.hidden = true;
      status.textContent = "";
      return;
    }
    const url = `${this.root.dataset.searchUrl}?${new URLSearchParams({q: query})}`;
    try {
      const response = await fetch(url, {credentials: "same-origin"});
      const body = await response.json();
      if (!response.ok) {
        status.textContent = body.error || `search failed (${response.status})`;
        list.hidden = true;
        return;
      }
      list.replaceChildren(
        ...body.matches.map((m) => element("li", {}, [element("span", {class: "line-number", text: `${m.line}`}), element("code", {text: m.text})])),
      );
      list.hidden = body.matches.length === 0;
      const count = `${body.matches.length}${body.truncated ? "+" : ""}`;
      status.textContent = body.matches.length ? `${count} line${body.matches.length === 1 ? "" : "s"} of the whole log` : "no line of the log has it";
    } catch (error) {
      status.textContent = `search failed: ${error}`;
    }
    document.dispatchEvent(new CustomEvent("run-log:searched", {detail: {query}}));
  }
}
