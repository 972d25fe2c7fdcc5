// The DOM helpers every page script shares: build elements (HTML and SVG), read a json_script.

const SVG_NS = "http://www.w3.org/2000/svg";

function fill(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null) continue;
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

// element("li", {class: "x", text: "hello"}, [children]): `text` sets the text, the rest are
// attributes (undefined and null ones are left out).
export function element(tag, attrs = {}, children = []) {
  return fill(document.createElement(tag), attrs, children);
}

export function svgElement(tag, attrs = {}, children = []) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

// One <li> per text, for a list's replaceChildren(...).
export function listItems(texts) {
  return texts.map((text) => element("li", {text}));
}

// The value of a {{ value|json_script:id }} on the page, or null when it is not there.
export function readJson(id) {
  const node = document.getElementById(id);
  return node ? JSON.parse(node.textContent) : null;
}
