// The data side of the live charts: a run's socket that reconnects with the last step it saw,
// the series a page holds for a run, and TensorBoard's smoothing. No drawing here (charts.js).

const RECONNECT_MAX_MS = 10000;
const REFUSED = {4401: "Sign in again to follow this run.", 4403: "This run is not yours."};

// TensorBoard's smoothing: an EMA divided by (1 - weight^n) so the start is not pulled to zero.
export function emaStart() {
  return {acc: 0, n: 0};
}

export function emaNext(state, value, weight) {
  state.acc = state.acc * weight + (1 - weight) * value;
  state.n += 1;
  if (weight === 0) return value;
  // 12 digits: the debiasing leaves rounding noise that autoscaling would blow up on a flat line.
  return Number((state.acc / (1 - Math.pow(weight, state.n))).toPrecision(12));
}

export function ema(values, weight) {
  const state = emaStart();
  return values.map((v) => emaNext(state, v, weight));
}

function finite(value) {
  return typeof value === "number" && Number.isFinite(value);
}

export function emptySeries() {
  return {step: [], time: [], value: []};
}

// Points of `coarse` outside [lo, hi] and every point of `fine` (inside), in step order. Every
// array the series carry is merged (a group's band has min, max, std and n besides).
export function mergeRange(coarse, fine, lo, hi) {
  const keys = Object.keys(coarse.step.length ? coarse : fine);
  const out = Object.fromEntries(keys.map((key) => [key, []]));
  const push = (s, i) => {
    for (const key of keys) out[key].push(s[key][i]);
  };
  let j = 0;
  for (let i = 0; i < coarse.step.length; i++) {
    const step = coarse.step[i];
    if (step >= lo && step <= hi) continue;
    while (step > hi && j < fine.step.length) push(fine, j++);
    push(coarse, i);
  }
  while (j < fine.step.length) push(fine, j++);
  return out;
}

// One run's series as the page knows them: {name: {step, time, value}} and the last step seen.
export class SeriesStore {
  constructor() {
    this.series = new Map();
    this.lastStep = null;
  }

  get(name) {
    return this.series.get(name);
  }

  replace(seriesByName, lastStep) {
    for (const [name, s] of Object.entries(seriesByName)) this.series.set(name, s);
    if (lastStep !== null && lastStep !== undefined) this.lastStep = Math.max(this.lastStep ?? lastStep, lastStep);
  }

  // Append live points; return [{name, step, time, value}] for those after the last step seen.
  append(points) {
    const added = [];
    for (const point of points) {
      if (this.lastStep !== null && point.step <= this.lastStep) continue;
      this.lastStep = point.step;
      for (const [name, value] of Object.entries(point.metrics)) {
        if (!finite(value)) continue;
        if (!this.series.has(name)) this.series.set(name, emptySeries());
        const s = this.series.get(name);
        s.step.push(point.step);
        s.time.push(point.time);
        s.value.push(value);
        added.push({name, step: point.step, time: point.time, value});
      }
    }
    return added;
  }
}

// A WebSocket to /ws/runs/<id>/ that reconnects with the last step it saw. With `since` (a step)
// it skips the metric backlog from the start: the server sends the run's status, the steps after
// `since`, then its events (what the sample inspector follows).
// Any close but a refusal (4401, 4403) is retried with a doubling delay: a server restart, or the
// server's 4503 when it loses Redis (it may accept and close again until Redis is back). The
// state stays "reconnecting" until the server's first message, which proves it joined the run's
// group; only then is the socket "live" and the delay reset.
export class RunStream {
  constructor(runId, {onMessage, onState, since = null, params = null}) {
    this.runId = runId;
    this.params = params || (() => ({})); // more of the query, read at each (re)connect
    this.onMessage = onMessage;
    this.onState = onState || (() => {});
    this.lastStep = since;
    this.hasBacklog = since !== null; // a complete backlog arrived: reconnect with ?since=
    this.sawBacklog = false;
    this.delay = 500;
    this.closed = false;
  }

  url() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = new URLSearchParams();
    if (this.hasBacklog && this.lastStep !== null) query.set("since", this.lastStep);
    for (const [key, value] of Object.entries(this.params())) query.set(key, value);
    const text = query.toString();
    return `${scheme}://${location.host}/ws/runs/${this.runId}/${text ? `?${text}` : ""}`;
  }

  open() {
    this.onState(this.socket || this.hasBacklog ? "reconnecting" : "connecting");
    const socket = new WebSocket(this.url());
    this.socket = socket;
    let answered = false;
    socket.onopen = () => {
      performance.mark(`posttrain:socket-open:${this.runId}`);
    };
    socket.onmessage = (event) => {
      const receivedAt = performance.timeOrigin + performance.now();
      const message = JSON.parse(event.data);
      if (!answered) {
        answered = true;
        this.delay = 500;
        this.onState("live");
      }
      if (message.type === "backlog") {
        if (!this.sawBacklog) performance.mark(`posttrain:first-backlog:${this.runId}`);
        this.sawBacklog = true;
        // A backlog cut off half-way is asked for again whole, not with ?since=.
        if (message.complete) this.hasBacklog = true;
        if (message.last_step !== null) this.lastStep = Math.max(this.lastStep ?? 0, message.last_step);
      } else if (message.type === "metrics" && message.points.length) {
        this.lastStep = Math.max(this.lastStep ?? 0, message.points[message.points.length - 1].step);
      }
      this.onMessage(message, receivedAt);
    };
    socket.onclose = (event) => {
      if (this.closed) return;
      if (REFUSED[event.code]) {
        this.closed = true;
        this.onState("refused", REFUSED[event.code]);
        return;
      }
      this.onState("reconnecting");
      setTimeout(() => this.open(), this.delay);
      this.delay = Math.min(this.delay * 2, RECONNECT_MAX_MS);
    };
  }

  close() {
    this.closed = true;
    if (this.socket) this.socket.close();
  }
}
