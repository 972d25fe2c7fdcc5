// PostTrain Studio sample inspector: step slider (live runs included), token view, response diffs
// and the reward trend. The pages render on the server; this script only adds interaction, and
// each part starts when its container is on the page.
(function () {
  "use strict";

  function readJson(id) {
    var node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fmt(value, digits) {
    if (value === null || value === undefined || !isFinite(value)) return "—";
    var text = Number(value).toPrecision(digits || 4);
    if (text.indexOf(".") < 0) return text;
    return text.replace(/0+(e|$)/, "$1").replace(/\.(e|$)/, "$1");
  }

  // -- step view: slider, step input, live steps ------------------------------------------------
  function initStepView(root) {
    var steps = readJson("inspector-steps") || [];
    var form = document.getElementById("step-form");
    var slider = document.getElementById("step-slider");
    var input = document.getElementById("step-input");
    if (slider && input) {
      slider.addEventListener("input", function () {
        input.value = steps[Number(slider.value)];
      });
      slider.addEventListener("change", function () {
        input.value = steps[Number(slider.value)];
        form.submit();
      });
      input.addEventListener("change", function () {
        form.submit();
      });
    }
    if (root.dataset.active === "1") pollSteps(root, steps, form, slider, input);
  }

  function pollSteps(root, steps, form, slider, input) {
    var split = root.dataset.split;
    var follow = document.getElementById("follow-latest");
    var news = document.getElementById("step-news");
    if (follow) follow.checked = sessionStorage.getItem("inspector-follow") === "1";
    if (follow) {
      follow.addEventListener("change", function () {
        sessionStorage.setItem("inspector-follow", follow.checked ? "1" : "0");
      });
    }
    function tick() {
      fetch(root.dataset.stepsUrl, { headers: { Accept: "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          if (!data) return;
          var fresh = data.steps[split] || [];
          var latest = fresh.length ? fresh[fresh.length - 1] : null;
          var known = steps.length ? steps[steps.length - 1] : null;
          if (latest !== null && latest !== known) {
            if (!slider || (follow && follow.checked)) {
              if (input) input.value = latest;
              else form.appendChild(hidden("step", latest));
              form.submit();
              return;
            }
            steps.splice(0, steps.length, ...fresh);
            slider.max = String(steps.length - 1);
            document.getElementById("step-last").textContent = latest;
            if (news) {
              news.hidden = false;
              news.textContent = "";
              var link = el("a", "", "step " + latest + " recorded: show it");
              link.href = "#";
              link.addEventListener("click", function (event) {
                event.preventDefault();
                input.value = latest;
                form.submit();
              });
              news.appendChild(link);
            }
          }
          if (data.active) setTimeout(tick, 5000);
        })
        .catch(function () { setTimeout(tick, 15000); });
    }
    setTimeout(tick, 5000);
  }

  function hidden(name, value) {
    var node = document.createElement("input");
    node.type = "hidden";
    node.name = name;
    node.value = value;
    return node;
  }

  // -- group view: text / token view, colour by log-prob, KL or advantage ------------------------
  var COLOUR_LABELS = {
    logprob: "log-prob",
    kl: "log-prob − ref log-prob",
    advantage: "advantage",
  };

  function tokenText(token) {
    // Byte-level BPE and SentencePiece mark spaces and newlines with visible characters.
    return token.replace(/\u0120/g, " ").replace(/\u2581/g, " ").replace(/\u010a/g, "\u21b5\n");
  }

  function scaleFor(rows, key) {
    if (key === "logprob") return 5; // log-probs at or below -5 get the strongest colour
    var max = 0;
    rows.forEach(function (row) {
      (row[key] || []).forEach(function (v) {
        if (v !== null && Math.abs(v) > max) max = Math.abs(v);
      });
    });
    return max > 0 ? max : 1;
  }

  function colourOf(key, value, scale) {
    if (value === null || value === undefined) return "";
    var strength = Math.min(1, Math.abs(value) / scale);
    if (key === "logprob") return "rgba(214, 60, 46, " + (0.85 * strength).toFixed(3) + ")";
    var rgb = value >= 0 ? (key === "kl" ? "47, 91, 211" : "31, 138, 76") : (key === "kl" ? "227, 134, 31" : "214, 60, 46");
    return "rgba(" + rgb + ", " + (0.8 * strength).toFixed(3) + ")";
  }

  function describe(key, token, value) {
    var text = "token " + JSON.stringify(token) + " · " + COLOUR_LABELS[key] + " ";
    if (value === null || value === undefined) return text + "not recorded";
    text += fmt(value, 4);
    if (key === "logprob") text += " (p = " + fmt(Math.exp(value), 3) + ")";
    return text;
  }

  function renderTokens(container, row, key, scale, readout) {
    container.textContent = "";
    var values = row[key];
    row.tokens.forEach(function (token, i) {
      var value = values ? values[i] : null;
      var span = el("span", "tok", tokenText(token));
      span.style.backgroundColor = colourOf(key, value, scale);
      if (value === null || value === undefined) span.classList.add("tok-none");
      span.dataset.value = value === null || value === undefined ? "" : String(value);
      span.title = describe(key, token, value);
      span.addEventListener("mouseenter", function () { readout.textContent = span.title; });
      container.appendChild(span);
    });
  }

  function renderLegend(legend, key, scale) {
    legend.textContent = "";
    var labels = key === "logprob"
      ? ["0 (sure)", "−" + fmt(scale / 2, 2), "≤ −" + fmt(scale, 2)]
      : ["−" + fmt(scale, 3), "0", "+" + fmt(scale, 3)];
    var values = key === "logprob" ? [0, -scale / 2, -scale] : [-scale, 0, scale];
    values.forEach(function (v, i) {
      var swatch = el("span", "swatch", labels[i]);
      swatch.style.backgroundColor = colourOf(key, v, scale);
      legend.appendChild(swatch);
    });
  }

  function initGroupView(root) {
    var rows = readJson("inspector-tokens") || [];
    var byId = {};
    rows.forEach(function (row) { byId[String(row.id)] = row; });
    var select = document.getElementById("colour-by");
    var legend = document.getElementById("token-legend");
    var readout = el("div", "token-readout", "hover a token to read its value");
    readout.id = "token-readout";
    legend.parentNode.appendChild(readout);
    var view = "text";

    function draw() {
      var key = select.value;
      var scale = scaleFor(rows, key);
      root.querySelectorAll(".tokens").forEach(function (box) {
        var row = byId[box.dataset.sampleId];
        if (row) renderTokens(box, row, key, scale, readout);
      });
      renderLegend(legend, key, scale);
      var missing = rows.every(function (row) { return !row[key]; });
      readout.textContent = missing
        ? COLOUR_LABELS[key] + " was not recorded for these responses"
        : "hover a token to read its value";
    }

    function show(next) {
      view = next;
      root.classList.toggle("token-mode", view === "tokens");
      root.querySelectorAll("[data-view]").forEach(function (b) {
        b.classList.toggle("active", b.dataset.view === view);
      });
      root.querySelectorAll(".response-text").forEach(function (n) { n.hidden = view === "tokens"; });
      root.querySelectorAll(".tokens").forEach(function (n) { n.hidden = view !== "tokens"; });
      if (view === "tokens") draw();
    }

    root.querySelectorAll("[data-view]").forEach(function (button) {
      button.addEventListener("click", function () { show(button.dataset.view); });
    });
    select.addEventListener("change", function () {
      var url = new URL(window.location.href);
      url.searchParams.set("colour", select.value);
      history.replaceState(null, "", url);
      draw();
    });
    show(window.location.hash === "#tokens" ? "tokens" : "text");
    var selected = root.querySelector(".response-card.selected");
    if (selected) selected.scrollIntoView({ block: "nearest" });
  }

  // -- across runs: word / character diff against the reference ---------------------------------
  function split(text, mode) {
    if (mode === "char") return Array.from(text);
    return text.match(/\s+|[\p{L}\p{N}_]+|[^\s\p{L}\p{N}_]/gu) || [];
  }

  var MAX_CELLS = 4000000;

  // Return [op, text] pieces turning a into b: "=" kept, "-" only in a, "+" only in b.
  function diff(a, b) {
    var start = 0;
    while (start < a.length && start < b.length && a[start] === b[start]) start++;
    var endA = a.length, endB = b.length;
    while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) { endA--; endB--; }
    var midA = a.slice(start, endA), midB = b.slice(start, endB);
    var n = midA.length, m = midB.length;
    var ops = [];
    if (start) ops.push(["=", a.slice(0, start).join("")]);
    if ((n + 1) * (m + 1) > MAX_CELLS) {
      if (n) ops.push(["-", midA.join("")]);
      if (m) ops.push(["+", midB.join("")]);
    } else {
      // Longest common subsequence over the middle, suffix table (lcs[i][j] for a[i:], b[j:]).
      var width = m + 1;
      var lcs = new Uint32Array((n + 1) * width);
      for (var i = n - 1; i >= 0; i--) {
        for (var j = m - 1; j >= 0; j--) {
          lcs[i * width + j] = midA[i] === midB[j]
            ? lcs[(i + 1) * width + j + 1] + 1
            : Math.max(lcs[(i + 1) * width + j], lcs[i * width + j + 1]);
        }
      }
      var x = 0, y = 0;
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

  function push(ops, op, text) {
    var last = ops[ops.length - 1];
    if (last && last[0] === op) last[1] += text;
    else ops.push([op, text]);
  }

  function initCompareView(root) {
    var references = {};
    var firstReference = null;
    root.querySelectorAll(".diffable[data-reference]").forEach(function (node) {
      references[node.dataset.sampleIndex] = node.textContent;
      if (firstReference === null) firstReference = node.textContent;
    });
    var originals = new Map();
    root.querySelectorAll(".diffable:not([data-reference])").forEach(function (node) {
      originals.set(node, node.textContent);
    });

    function draw(mode) {
      originals.forEach(function (text, node) {
        var ref = references[node.dataset.sampleIndex];
        if (ref === undefined) ref = firstReference;
        node.textContent = "";
        if (ref === null) { node.textContent = text; return; }
        diff(split(ref, mode), split(text, mode)).forEach(function (piece) {
          if (piece[0] === "=") node.appendChild(document.createTextNode(piece[1]));
          else node.appendChild(el(piece[0] === "+" ? "ins" : "del", piece[0] === "+" ? "diff-ins" : "diff-del", piece[1]));
        });
      });
      root.querySelectorAll("[data-diff]").forEach(function (b) {
        b.classList.toggle("active", b.dataset.diff === mode);
      });
    }

    root.querySelectorAll("[data-diff]").forEach(function (button) {
      button.addEventListener("click", function () { draw(button.dataset.diff); });
    });
    draw("word");
  }

  // -- across steps: the reward trend as a small SVG chart ---------------------------------------
  var SVG = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function initTrend(container) {
    var points = (readJson("inspector-trend") || []).filter(function (p) { return p.reward !== null; });
    if (!points.length) { container.textContent = "No finite rewards to plot."; return; }
    var W = 640, H = 170, L = 46, R = 12, T = 10, B = 28;
    var xs = points.map(function (p) { return p.step; });
    var ys = points.map(function (p) { return p.reward; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
    function px(x) { return L + (x - x0) / (x1 - x0) * (W - L - R); }
    function py(y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); }
    var chart = svg("svg", { viewBox: "0 0 " + W + " " + H, class: "trend", role: "img" });
    chart.appendChild(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
    chart.appendChild(svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
    [[y0, py(y0)], [y1, py(y1)]].forEach(function (t) {
      chart.appendChild(svg("text", { x: L - 6, y: t[1] + 4, "text-anchor": "end" }, fmt(t[0], 3)));
    });
    [[x0, px(x0)], [x1, px(x1)]].forEach(function (t) {
      chart.appendChild(svg("text", { x: t[1], y: H - 8, "text-anchor": "middle" }, "step " + Math.round(t[0])));
    });
    var path = points.map(function (p) { return px(p.step).toFixed(1) + "," + py(p.reward).toFixed(1); });
    chart.appendChild(svg("polyline", { points: path.join(" "), class: "line" }));
    points.forEach(function (p) {
      var dot = svg("circle", { cx: px(p.step), cy: py(p.reward), r: 3.5, class: "dot" });
      dot.appendChild(svg("title", {}, "step " + p.step + ": mean reward " + fmt(p.reward, 4) + " over " + p.n));
      chart.appendChild(dot);
    });
    container.appendChild(chart);
  }

  function init() {
    var step = document.getElementById("inspector-step");
    if (step) initStepView(step);
    var group = document.getElementById("inspector-group");
    if (group) initGroupView(group);
    var compare = document.getElementById("inspector-compare");
    if (compare) initCompareView(compare);
    var trend = document.getElementById("trend-chart");
    if (trend) initTrend(trend);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
