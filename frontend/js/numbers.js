// A metric's value as every page prints it: webapp.runs.numbers.metric_text in JavaScript, so a
// page's first paint (the server's) and its live updates (this) read the same. Four significant
// digits from 0.001 up (more when the whole part is longer), whole numbers whole, an exponent
// with three significant digits below 0.001 and from 1e15 up: 0.8125, 12.35, 1235, 1e-6, 2.35e-5.
// toFixed and toExponential round half up on the exact double, as the server's Decimal does.

const PLAIN_MIN = 1e-3;
const PLAIN_MAX = 1e15;
const DECIMALS = [[1000, 0], [100, 1], [10, 2], [1, 3], [0.1, 4], [0.01, 5], [PLAIN_MIN, 6]];

function strip(text) {
  return text.includes(".") ? text.replace(/0+$/, "").replace(/\.$/, "") : text;
}

export function formatMetric(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "number") return String(value);
  if (!Number.isFinite(value)) return "—";
  const magnitude = Math.abs(value);
  if (Number.isInteger(value) && magnitude < PLAIN_MAX) return String(value === 0 ? 0 : value);
  if (magnitude < PLAIN_MIN || magnitude >= PLAIN_MAX) {
    const [mantissa, exponent] = value.toExponential(2).split("e");
    return `${strip(mantissa)}e${Number(exponent)}`;
  }
  const decimals = DECIMALS.find(([floor]) => magnitude >= floor)[1];
  return strip(value.toFixed(decimals));
}
