// The sweep page's parallel-coordinates chart: one line per member from its swept values to its
// final reward. The server builds the figure (webapp.sweeps.selectors); this only draws it.
import {readJson} from "./dom.js";

function draw() {
  const figure = readJson("sweep-parcoords-data");
  const node = document.getElementById("sweep-parcoords");
  if (!figure || !node) return;
  const layout = {margin: {l: 80, r: 40, t: 40, b: 20}, height: 360, font: {family: "system-ui, sans-serif", size: 11}};
  Plotly.react(node, figure.data, layout, {responsive: true, displaylogo: false});
}

// Plotly loads deferred, after this module; both have run by DOMContentLoaded.
if (window.Plotly) draw();
else window.addEventListener("DOMContentLoaded", draw);
