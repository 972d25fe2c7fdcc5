// PostTrain Studio sample inspector: step slider (a live run's new steps come from its socket),
// token view, response diffs and the reward trend. The pages render on the server; this script
// only adds interaction, and each part starts when its container is on the page.
import {element, readJson, svgElement} from "./dom.js";
import {RunStream} from "./stream.js";

function fmt(value, digits) {
  if (value === null || value === undefined || !isFinite(value)) return "—";
  const text = Number(value).toPrecision(digits || 4);
  if (!text.includes(".")) return text;
  return text.replace(/0+(e|$)/, "$1").replace(/\.(e|$)/, "$1");
}

// -- step view: slider, step input, live steps --------------------------------------------------
function initStepView(root) {
  const steps = readJson("inspector-steps") || [];
  const form = document.getElementById("step-form");
  const slider = document.getElementById("step-slider");
  const input = document.getElementById("step-input");
  if (slider && input) {
    slider.addEventListener("input", () => {
      input.value = steps[Number(slider.value)];
    });
    slider.addEventListener("change", () => {
      input.value = steps[Number(slider.value)];
      form.submit();
    });
    input.addEventListener("change", () => form.submit());
  }
  if (root.dataset.active === "1") followSteps(root, steps, form, slider, input);
}

// A live run: the run's socket says when a step's samples are written (a `samples` event); the
// step list is read again then, and on each (re)connect, whose `status` message comes after the
// server joined the run's group, so no step written while the socket was away is missed.
function followSteps(root, steps, form, slider, input) {
  const split = root.dataset.split;
  const follow = document.getElementById("follow-latest");
  const news = document.getElementById("step-news");
  if (follow) {
    follow.checked = sessionStorage.getItem("inspector-follow") === "1";
    follow.addEventListener("change", () => {
      sessionStorage.setItem("inspector-follow", follow.checked ? "1" : "0");
    });
  }
  let running = false;
  let again = false;
  let leaving = false;

  function show(latest, fresh) {
    if (!slider || (follow && follow.checked)) {
      leaving = true;
      stream.close();
      if (input) input.value = latest;
      else form.append(element("input", {type: "hidden", name: "step", value: latest}));
      form.submit();
      return;
    }
    steps.splice(0, steps.length, ...fresh);
    slider.max = String(steps.length - 1);
    document.getElementById("step-last").textContent = latest;
    if (news) {
      news.hidden = false;
      const link = element("a", {href: "#", text: `step ${latest} recorded: show it`});
      link.addEventListener("click", (event) => {
        event.preventDefault();
        input.value = latest;
        form.submit();
      });
      news.replaceChildren(link);
    }
  }

  // Read the steps with samples; events that come meanwhile ask for one more read after it.
  async function refresh() {
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      const response = await fetch(root.dataset.stepsUrl, {headers: {Accept: "application/json"}});
      const data = response.ok ? await response.json() : null;
      if (!data || leaving) return;
      const fresh = data.steps[split] || [];
      const latest = fresh.length ? fresh[fresh.length - 1] : null;
      const known = steps.length ? steps[steps.length - 1] : null;
      if (latest !== null && latest !== known) show(latest, fresh);
      if (!data.active) stream.close();
    } catch (error) {
      setTimeout(refresh, 15000);
    } finally {
      running = false;
      if (again && !leaving) {
        again = false;
        refresh();
      }
    }
  }

  const stream = new RunStream(Number(root.dataset.runId), {
    since: Number(root.dataset.since),
    onState: (state) => { root.dataset.socket = state; },
    onMessage: (message) => {
      if (message.type === "status") {
        root.dataset.socket = "following";
        refresh();
      } else if (message.type === "samples" && message.split === split) {
        refresh();
      }
    },
  });
  stream.open();
  window.postTrainStream = stream;
}

// -- group view: text / token view, colour by log-prob, KL or advantage -------------------------
const COLOUR_LABELS = {
  logprob: "log-prob",
  kl: "log-prob − ref log-prob",
  advantage: "advantage",
};

function tokenText(token) {
  // Byte-level BPE and SentencePiece mark spaces and newlines with visible characters.
  return token.replace(/\u0120/g, " ").replace(/\u2581/g, " ").replace(/\u010a/g, "\u21b5\n");
}

// A token as the tokenizer decodes it: the server maps byte-level BPE symbols back to bytes and
// decodes across tokens (webapp.samples.tokens), so "Ã" + "Ĺ" reads "" + "×" and a lone byte
// 0xDE reads \xDE, not "Þ". Tokens that are not byte-level show their symbol.
function tokenLabel(row, i) {
  if (!row.text) return tokenText(row.tokens[i]);
  if (row.partial[i] && !row.text[i]) return "\u00b7"; // half a character: the next one ends it
  return row.text[i].replace(/\n/g, "\u21b5\n");
}

function tokenName(row, i) {
  const name = `token ${JSON.stringify(row.tokens[i])}`;
  // Its bytes, where the symbol does not say them: beyond ASCII (a part of a character).
  if (!row.hex || !row.hex[i].split(" ").some((b) => parseInt(b, 16) >= 0x80)) return name;
  const what = row.bad[i] ? ", not UTF-8 here" : row.partial[i] ? ", the start of a character the next token ends" : "";
  return `${name} (bytes ${row.hex[i]}${what})`;
}

function scaleFor(rows, key) {
  if (key === "logprob") return 5; // log-probs at or below -5 get the strongest colour
  let max = 0;
  for (const row of rows) {
    for (const v of row[key] || []) if (v !== null && Math.abs(v) > max) max = Math.abs(v);
  }
  return max > 0 ? max : 1;
}

function colourOf(key, value, scale) {
  if (value === null || value === undefined) return "";
  const strength = Math.min(1, Math.abs(value) / scale);
  if (key === "logprob") return `rgba(214, 60, 46, ${(0.85 * strength).toFixed(3)})`;
  const rgb = value >= 0 ? (key === "kl" ? "47, 91, 211" : "31, 138, 76") : (key === "kl" ? "227, 134, 31" : "214, 60, 46");
  return `rgba(${rgb}, ${(0.8 * strength).toFixed(3)})`;
}

function describe(key, name, value) {
  const text = `${name} · ${COLOUR_LABELS[key]} `;
  if (value === null || value === undefined) return `${text}not recorded`;
  if (key === "logprob") return `${text}${fmt(value, 4)} (p = ${fmt(Math.exp(value), 3)})`;
  return text + fmt(value, 4);
}

function renderTokens(container, row, key, scale, readout) {
  const values = row[key];
  container.replaceChildren(...row.tokens.map((token, i) => {
    const value = values ? values[i] : null;
    const missing = value === null || value === undefined;
    const classes = ["tok", missing ? "tok-none" : "", row.partial?.[i] ? "tok-partial" : "", row.bad?.[i] ? "tok-bad" : ""];
    const span = element("span", {class: classes.filter(Boolean).join(" "), text: tokenLabel(row, i)});
    span.style.backgroundColor = colourOf(key, value, scale);
    span.dataset.value = missing ? "" : String(value);
    span.title = describe(key, tokenName(row, i), value);
    span.addEventListener("mouseenter", () => { readout.textContent = span.title; });
    return span;
  }));
}

function renderLegend(legend, key, scale) {
  const labels = key === "logprob"
    ? ["0 (sure)", `−${fmt(scale / 2, 2)}`, `≤ −${fmt(scale, 2)}`]
    : [`−${fmt(scale, 3)}`, "0", `+${fmt(scale, 3)}`];
  const values = key === "logprob" ? [0, -scale / 2, -scale] : [-scale, 0, scale];
  legend.replaceChildren(...values.map((v, i) => {
    const swatch = element("span", {class: "swatch", text: labels[i]});
    swatch.style.backgroundColor = colourOf(key, v, scale);
    return swatch;
  }));
}

function initGroupView(root) {
  const rows = readJson("inspector-tokens") || [];
  const byId = new Map(rows.map((row) => [String(row.id), row]));
  const select = document.getElementById("colour-by");
  const legend = document.getElementById("token-legend");
  const readout = element("div", {id: "token-readout", class: "token-readout", text: "hover a token to read its value"});
  legend.parentNode.append(readout);

  function draw() {
    const key = select.value;
    const scale = scaleFor(rows, key);
    for (const box of root.querySelectorAll(".tokens")) {
      const row = byId.get(box.dataset.sampleId);
      if (row) renderTokens(box, row, key, scale, readout);
    }
    renderLegend(legend, key, scale);
    const missing = rows.every((row) => !row[key]);
    readout.textContent = missing
      ? `${COLOUR_LABELS[key]} was not recorded for these responses`
      : "hover a token to read its value";
  }

  function show(view) {
    root.classList.toggle("token-mode", view === "tokens");
    for (const b of root.querySelectorAll("[data-view]")) b.classList.toggle("active", b.dataset.view === view);
    for (const n of root.querySelectorAll(".response-text")) n.hidden = view === "tokens";
    for (const n of root.querySelectorAll(".tokens")) n.hidden = view !== "tokens";
    if (view === "tokens") draw();
  }

  for (const button of root.querySelectorAll("[data-view]")) {
    button.addEventListener("click", () => show(button.dataset.view));
  }
  select.addEventListener("change", () => {
    const url = new URL(window.location.href);
    url.searchParams.set("colour", select.value);
    history.replaceState(null, "", url);
    draw();
  });
  show(window.location.hash === "#tokens" ? "tokens" : "text");
  const selected = root.querySelector(".response-card.selected");
  if (selected) selected.scrollIntoView({block: "nearest"});
}

// -- across runs: word / character diff against the reference -----------------------------------
function splitText(text, mode) {
  if (mode === "char") return Array.from(text);
  return text.match(/\s+|[\p{L}\p{N}_]+|[^\s\p{L}\p{N}_]/gu) || [];
}

const MAX_CELLS = 4000000;

function push(ops, op, text) {
  const last = ops[ops.length - 1];
  if (last && last[0] === op) last[1] += text;
  else ops.push([op, text]);
}

// Return [op, text] pieces turning a into b: "=" kept, "-" only in a, "+" only in b.
function diff(a, b) {
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start++;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) { endA--; endB--; }
  const midA = a.slice(start, endA);
  const midB = b.slice(start, endB);
  const n = midA.length;
  const m = midB.length;
  const ops = [];
  if (start) ops.push(["=", a.slice(0, start).join("")]);
  if ((n + 1) * (m + 1) > MAX_CELLS) {
    if (n) ops.push(["-", midA.join("")]);
    if (m) ops.push(["+", midB.join("")]);
  } else {
    // Longest common subsequence over the middle, suffix table (lcs[i][j] for a[i:], b[j:]).
    const width = m + 1;
    const lcs = new Uint32Array((n + 1) * width);
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        lcs[i * width + j] = midA[i] === midB[j]
          ? lcs[(i + 1) * width + j + 1] + 1
          : Math.max(lcs[(i + 1) * width + j], lcs[i * width + j + 1]);
      }
    }
    let x = 0;
    let y = 0;
    while (x < n || y < m) {
      if (x < n && y < m && midA[x] === midB[y]) { push(ops, "=", midA[x]); x++; y++; }
      else if (y < m && (x === n || lcs[x * width + y + 1] >= lcs[(x + 1) * width + y])) {
        push(ops, "+", midB[y]); y++;
      } else { push(ops, "-", midA[x]); x++; }
    }
  }
  if (endA < a.length) ops.push(["=", a.slice(endA).join("")]);
  return ops;
}

function initCompareView(root) {
  const references = {};
  let firstReference = null;
  for (const node of root.querySelectorAll(".diffable[data-reference]")) {
    references[node.dataset.sampleIndex] = node.textContent;
    if (firstReference === null) firstReference = node.textContent;
  }
  const originals = new Map();
  for (const node of root.querySelectorAll(".diffable:not([data-reference])")) originals.set(node, node.textContent);

  function draw(mode) {
    for (const [node, text] of originals) {
      const ref = references[node.dataset.sampleIndex] ?? firstReference;
      if (ref === null) {
        node.textContent = text;
        continue;
      }
      node.replaceChildren(...diff(splitText(ref, mode), splitText(text, mode)).map(([op, piece]) => {
        if (op === "=") return document.createTextNode(piece);
        return op === "+" ? element("ins", {class: "diff-ins", text: piece}) : element("del", {class: "diff-del", text: piece});
      }));
    }
    for (const b of root.querySelectorAll("[data-diff]")) b.classList.toggle("active", b.dataset.diff === mode);
  }

  for (const button of root.querySelectorAll("[data-diff]")) {
    button.addEventListener("click", () => draw(button.dataset.diff));
  }
  draw("word");
}

// -- across steps: the reward trend as a small SVG chart -----------------------------------------
function initTrend(container) {
  const points = (readJson("inspector-trend") || []).filter((p) => p.reward !== null);
  if (!points.length) {
    container.textContent = "No finite rewards to plot.";
    return;
  }
  const W = 640, H = 170, L = 46, R = 12, T = 10, B = 28;
  const xs = points.map((p) => p.step);
  const ys = points.map((p) => p.reward);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const py = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  const chart = svgElement("svg", {viewBox: `0 0 ${W} ${H}`, class: "trend", role: "img"}, [
    svgElement("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis"}),
    svgElement("line", {x1: L, y1: T, x2: L, y2: H - B, class: "axis"}),
    ...[y0, y1].map((y) => svgElement("text", {x: L - 6, y: py(y) + 4, "text-anchor": "end", text: fmt(y, 3)})),
    // The first step's label starts at its point and the last one's ends at it: centred, the
    // last label ran past the chart's right edge and was cut.
    ...[[x0, "start"], [x1, "end"]].map(([x, anchor]) => svgElement("text", {x: px(x), y: H - 8, "text-anchor": anchor, text: `step ${Math.round(x)}`, class: "step-label"})),
    svgElement("polyline", {points: points.map((p) => `${px(p.step).toFixed(1)},${py(p.reward).toFixed(1)}`).join(" "), class: "line"}),
    ...points.map((p) => svgElement("circle", {cx: px(p.step), cy: py(p.reward), r: 3.5, class: "dot"}, [
      svgElement("title", {text: `step ${p.step}: mean reward ${fmt(p.reward, 4)} over ${p.n}`}),
    ])),
  ]);
  container.append(chart);
}

function start() {
  const step = document.getElementById("inspector-step");
  if (step) initStepView(step);
  const group = document.getElementById("inspector-group");
  if (group) initGroupView(group);
  const compare = document.getElementById("inspector-compare");
  if (compare) initCompareView(compare);
  const trend = document.getElementById("trend-chart");
  if (trend) initTrend(trend);
}

start();
