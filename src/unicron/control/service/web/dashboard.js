// The Unicron dashboard: polls /v1/dashboard about once a second with the bearer token it was
// given and redraws the cluster map, the tasks, the WAF chart, the incidents with their
// breakdowns and the plan changes. No build step: plain JavaScript and the vendored uPlot.
"use strict";

const POLL_MS = 1000;
const KEY = "unicron-token";
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const PHASES = ["detection", "decision", "transition", "first_step"];

const state = { since: 0, times: [], cluster: [], tasks: {}, taskNames: [], chart: null, failures: 0, timer: null, seq: 0 };

function token() {
  const found = /[#&]token=([^&]+)/.exec(location.hash);
  if (found) {  // given once in the address's fragment (never sent to the server): kept for this tab
    sessionStorage.setItem(KEY, decodeURIComponent(found[1]));
    history.replaceState(null, "", location.pathname);
  }
  return sessionStorage.getItem(KEY);
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k === "style") node.style.cssText = v; else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function colour(task) {
  let h = 0;
  for (const c of task) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return PALETTE[h % PALETTE.length];
}

function flops(value) {
  if (value === null || value === undefined) return "-";
  const units = ["", "k", "M", "G", "T", "P", "E"];
  let i = 0;
  while (Math.abs(value) >= 1000 && i < units.length - 1) { value /= 1000; i++; }
  return `${value.toFixed(value < 10 ? 2 : 1)} ${units[i]}FLOP/s`;
}

function seconds(value) { return value === null || value === undefined ? "-" : `${value.toFixed(value < 1 ? 3 : 2)} s`; }
function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }

function renderMap(doc) {
  const map = document.getElementById("map");
  map.replaceChildren(...doc.nodes.map((n) => el("div", { class: `node ${n.state}`, "data-node": n.name },
    el("span", { class: "name" }, n.name),
    el("span", { class: "state" }, n.state),
    ...n.slots.map((s) => el("span", {
      class: `slot${s.spare ? " spare" : ""}`,
      "data-task": s.task || "",
      title: s.task ? `${s.task}${s.spare ? " (hot spare)" : ""}` : "idle",
      style: s.task ? `background:${colour(s.task)}33;border-color:${colour(s.task)}` : "",
    }, s.task ? (s.spare ? `spare ${s.task}` : s.task) : "")),
  )));
  const legend = document.getElementById("legend");
  legend.replaceChildren(...doc.tasks.filter((t) => t.workers > 0).map((t) =>
    el("span", {}, el("i", { style: `background:${colour(t.name)}` }), t.name)),
    el("span", {}, el("i", { style: "border:2px dashed #1d2430" }), "hot spare"));
}

function renderTasks(doc) {
  const body = document.querySelector("#tasks tbody");
  body.replaceChildren(...doc.tasks.map((t) => el("tr", { "data-task": t.name, "data-state": t.state },
    el("td", {}, el("i", { style: `display:inline-block;width:10px;height:10px;margin-right:5px;background:${colour(t.name)}` }), t.name),
    el("td", {}, t.state), el("td", {}, t.weight), el("td", {}, t.workers), el("td", {}, t.replicas),
    el("td", {}, `${t.step}/${t.iterations}`), el("td", {}, t.failures), el("td", {}, seconds(t.downtime_s)),
    el("td", {}, flops(t.measured_flops)), el("td", {}, flops(t.planned_waf)), el("td", {}, flops(t.achieved_waf)))));
}

function renderChart(doc) {
  for (const p of doc.series) {
    state.times.push(p.time);
    state.cluster.push(p.cluster);
    for (const name of Object.keys(p.tasks)) {
      if (!(name in state.tasks)) state.tasks[name] = new Array(state.times.length - 1).fill(null);
    }
    for (const [name, values] of Object.entries(state.tasks)) values.push(name in p.tasks ? p.tasks[name] : null);
    state.since = Math.max(state.since, p.time);
  }
  const names = Object.keys(state.tasks).sort();
  const data = [state.times, state.cluster, ...names.map((n) => state.tasks[n])];
  const box = document.getElementById("chart");
  if (!state.chart || names.join() !== state.taskNames.join()) {
    if (state.chart) state.chart.destroy();
    state.taskNames = names;
    state.chart = new uPlot({
      width: Math.max(400, box.clientWidth - 10), height: 250,
      series: [{}, { label: "cluster", stroke: "#1d2430", width: 2, value: (u, v) => flops(v) },
        ...names.map((n) => ({ label: n, stroke: colour(n), value: (u, v) => flops(v) }))],
      axes: [{}, { values: (u, ticks) => ticks.map((v) => flops(v)), size: 110 }],
    }, data, box);
  } else {
    state.chart.setData(data);
  }
}

function renderIncidents(doc) {
  const list = document.getElementById("incidents");
  list.replaceChildren(...[...doc.incidents].reverse().map((b) => {
    const s = b.seconds;
    const total = PHASES.reduce((sum, p) => sum + (s[p] || 0), 0) || 1;
    const kind = b.first_seen_as ? `${b.kind} (first seen as ${b.first_seen_as})` : b.kind;
    return el("li", { class: `incident ${b.outcome || "open"}`, "data-incident": b.incident, "data-outcome": b.outcome || "open" },
      el("div", { class: "head" }, `#${b.incident} ${b.task || ""} · ${kind} · ${b.severity} · ${b.node || "-"} · ${clock(b.detected_at)}`),
      el("div", { class: "bar" }, ...PHASES.filter((p) => s[p]).map((p) =>
        el("span", { class: `phase-${p}`, title: `${p}: ${seconds(s[p])}`, style: `width:${(100 * s[p]) / total}%` }))),
      el("div", { class: "phases" }, ...PHASES.map((p) => el("span", { "data-phase": p }, `${p.replace("_", " ")} ${seconds(s[p])}  `))),
      el("div", { class: "cost" },
        `fault ${b.fault_source || "time unknown"} · downtime ${seconds(b.downtime_s)} · lost `,
        el("span", { "data-lost": "steps" }, b.lost_steps === null ? "?" : b.lost_steps), " step(s), ",
        el("span", { "data-lost": "micro_batches" }, b.lost_micro_batches), " micro-batch(es) · ",
        el("span", { "data-actions": "" }, b.actions.join(" → ") || "no action yet"), ` · ${b.outcome || "open"}`));
  }));
}

function renderPlans(doc) {
  const list = document.getElementById("plans");
  list.replaceChildren(...[...doc.plans].reverse().map((p) => el("li", { "data-plan": p.id },
    `${clock(p.time)} · ${p.source}${p.answers ? ` (answers ${p.answers})` : ""} · `,
    Object.entries(p.changes).map(([t, [a, b]]) => `${t} ${a}→${b}`).join(", "),
    p.why ? ` · ${p.why}` : "", ` · WAF ${flops(p.waf)}`)));
}

function render(doc) {
  document.getElementById("waf-achieved").textContent = flops(doc.waf.achieved);
  document.getElementById("waf-planned").textContent = flops(doc.waf.planned);
  document.getElementById("waf-optimum").textContent = flops(doc.waf.optimum);
  document.getElementById("open-incidents").textContent = doc.open_incidents;
  renderMap(doc);
  renderTasks(doc);
  renderChart(doc);
  renderIncidents(doc);
  renderPlans(doc);
}

function showLogin(why) {
  document.getElementById("main").hidden = true;
  document.getElementById("login").hidden = false;
  setStatus(why, true);
}

function setStatus(text, stale) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.classList.toggle("stale", Boolean(stale));
}

function schedule(ms) {  // one poll loop at a time
  clearTimeout(state.timer);
  state.timer = setTimeout(poll, ms);
}

async function poll() {
  const mine = ++state.seq;  // a newer poll (a new token given meanwhile) makes this one's answer void
  const bearer = token();
  if (!bearer) { showLogin("a token is needed"); return; }
  try {
    const response = await fetch(`/v1/dashboard?since=${state.since}`, { headers: { Authorization: `Bearer ${bearer}` } });
    if (mine !== state.seq) return;
    if (response.status === 401 || response.status === 403) {
      if (sessionStorage.getItem(KEY) === bearer) sessionStorage.removeItem(KEY);
      showLogin(`the token was refused (${response.status})`);
      return;
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const doc = await response.json();
    if (mine !== state.seq) return;
    document.getElementById("login").hidden = true;
    document.getElementById("main").hidden = false;
    render(doc);
    state.failures = 0;
    setStatus(`updated ${clock(doc.time)}`, false);
  } catch (error) {
    if (mine !== state.seq) return;
    state.failures += 1;
    setStatus(`cannot reach the coordinator (${error.message}); retrying`, true);
  }
  schedule(POLL_MS * Math.min(10, 2 ** Math.max(0, state.failures - 1)));
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, document.getElementById("token").value.trim());
  schedule(0);
});
window.addEventListener("hashchange", () => schedule(0));  // a token given in the address again
schedule(0);
