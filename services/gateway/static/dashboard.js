// The dashboard: reads budgets and jobs through the REST API with the viewer's
// token (from the URL fragment, which never reaches a server log, or the form)
// and draws each party's epsilon over time as an SVG line against its cap.
"use strict";
const COLOURS = ["#2f7de1", "#e1662f", "#2fa866", "#a83fd1", "#d1a13f", "#3fc1d1", "#d13f7a", "#6b7a8f"];
const SVG = "http://www.w3.org/2000/svg";

function token() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) sessionStorage.setItem("capc-token", decodeURIComponent(m[1]));
  return sessionStorage.getItem("capc-token");
}

async function get(path) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + token() } });
  if (!r.ok) {
    let detail = r.statusText;
    try { detail = (await r.json()).detail; } catch (e) { /* not JSON */ }
    throw new Error(r.status + " " + detail);
  }
  return r.json();
}

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function drawChart(history) {
  const svg = document.getElementById("chart");
  svg.replaceChildren();
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  const pad = { l: 56, r: 16, t: 14, b: 36 };
  const series = history.series;
  const times = series.flatMap(s => s.points.map(p => Date.parse(p.at)));
  const now = Date.now();
  const t0 = times.length ? Math.min(...times) : now - 60000;
  const t1 = Math.max(times.length ? Math.max(...times) : now, t0 + 1000);
  const finiteCaps = series.map(s => s.epsilon_cap).filter(c => c < 1e5);
  const top = Math.max(1e-3, ...series.flatMap(s => s.points.map(p => p.epsilon)), ...finiteCaps) * 1.08;
  const x = t => pad.l + (t - t0) / (t1 - t0) * (W - pad.l - pad.r);
  const y = e => H - pad.b - e / top * (H - pad.t - pad.b);
  for (let i = 0; i <= 4; i++) {
    const e = top * i / 4;
    el("line", { x1: pad.l, x2: W - pad.r, y1: y(e), y2: y(e), stroke: "#eef0f3" }, svg);
    el("text", { x: pad.l - 6, y: y(e) + 4, "text-anchor": "end", "font-size": 11, fill: "#5b6675" }, svg).textContent = e.toPrecision(3);
  }
  el("text", { x: 12, y: pad.t + 8, "font-size": 11, fill: "#5b6675" }, svg).textContent = "ε";
  el("text", { x: W - pad.r, y: H - 10, "text-anchor": "end", "font-size": 11, fill: "#5b6675" }, svg).textContent =
    new Date(t1).toLocaleTimeString();
  el("text", { x: pad.l, y: H - 10, "font-size": 11, fill: "#5b6675" }, svg).textContent = new Date(t0).toLocaleTimeString();
  const legend = document.getElementById("legend");
  legend.replaceChildren();
  series.forEach((s, i) => {
    const colour = COLOURS[i % COLOURS.length];
    if (s.epsilon_cap < 1e5 && s.epsilon_cap <= top) {
      el("line", { x1: pad.l, x2: W - pad.r, y1: y(s.epsilon_cap), y2: y(s.epsilon_cap), stroke: colour,
        "stroke-dasharray": "6 4", "stroke-width": 1.2, class: "cap" }, svg);
    }
    const pts = [[t0, 0], ...s.points.map(p => [Date.parse(p.at), p.epsilon])];
    const last = pts[pts.length - 1];
    pts.push([t1, last[1]]);
    // A step line: epsilon jumps at each ledger entry and stays until the next.
    let d = "";
    pts.forEach(([t, e], k) => {
      d += k === 0 ? `M${x(t)},${y(e)}` : `H${x(t)}V${y(e)}`;
    });
    // Earlier parties are drawn wider, so equal spends stay visible beneath later ones.
    const width = 2 + 2.5 * (series.length - 1 - i);
    el("path", { d, fill: "none", stroke: colour, "stroke-width": width, class: "spend", "data-party": s.party }, svg);
    const item = document.createElement("span");
    item.innerHTML = `<i style="background:${colour}"></i>`;
    item.append(`${s.party}: ε ${last[1].toFixed(3)} of ${s.epsilon_cap}`);
    legend.appendChild(item);
  });
}

function fill(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows.map(cells => {
    const tr = document.createElement("tr");
    for (const c of cells) {
      const td = document.createElement("td");
      if (c instanceof Node) td.appendChild(c); else td.textContent = c;
      tr.appendChild(td);
    }
    return tr;
  }));
}

// The hospital's own ledger beside the guardian's: a disagreement is flagged.
function ledgerState(p) {
  const span = document.createElement("span");
  const own = p.own_ledger;
  span.className = "ledger-" + own.state;
  span.setAttribute("data-ledgers", p.name);
  span.textContent = own.state === "diverged" ? `DIVERGED (gap ε ${own.gap.toPrecision(3)})`
    : own.state === "agree" ? `agree through round ${own.through_round}` : own.state;
  return span;
}

// A DP-trained hospital's training, charged once, apart from its round charges.
function trainings(p) {
  if (!p.trainings || !p.trainings.length) return "";
  const each = p.trainings.map(t => `training: ε ${t.epsilon.toFixed(4)} (${t.described})`);
  return `${each.join("; ")}; rounds: ε ${p.rounds_epsilon.toFixed(4)}`;
}

function progress(fraction) {
  const bar = document.createElement("div");
  bar.className = "bar";
  const inner = document.createElement("div");
  inner.style.width = `${Math.round(100 * fraction)}%`;
  bar.appendChild(inner);
  return bar;
}

function interval(a) {
  const hi = a.empirical_upper === null ? "∞" : a.empirical_upper.toFixed(2);
  return `≥ ${a.empirical_lower.toFixed(3)} (${a.empirical_lower.toFixed(2)}–${hi})`;
}

function verdict(a) {
  const span = document.createElement("span");
  span.className = a.refuted ? "refuted" : "holds";
  span.textContent = a.refuted ? "claim refuted" : "consistent";
  return span;
}

function accuracy(a) {
  return a === null ? "not trained" : a.toFixed(3);
}

// The CaPC loop's row: shown only when this gateway's student party queries for a hospital.
async function refreshLoop() {
  const section = document.getElementById("loop-section");
  let loop;
  try { loop = await get("/v1/loop"); } catch (e) { section.hidden = true; return; }
  section.hidden = !loop.hospital;
  if (!loop.hospital) return;
  const spent = Object.entries(loop.epsilon_by_party).map(([p, e]) => `${p}: ${e.toFixed(4)}`).join(", ");
  fill("loop", [[
    `${loop.hospital} (${loop.querier})`,
    // Which model "before" is: the best of the candidates fitted on its own records.
    accuracy(loop.accuracy_before) + (loop.before && loop.before.metrics.before_model ? ` (${loop.before.metrics.before_model})` : ""),
    accuracy(loop.accuracy_after),
    loop.gain === null ? "" : (loop.gain >= 0 ? "+" : "") + loop.gain.toFixed(3),
    `${loop.epsilon_spent.toFixed(4)}${spent ? ` (${spent})` : ""}`, loop.labels_bought,
    // Composition is not linear: no "epsilon per label" is shown, only what is left.
    Object.keys(loop.queries_left || {}).length ? Math.min(...Object.values(loop.queries_left)) : "",
    loop.records_revealed,
  ]]);
}

// Every CaPC loop the guardian bound (admin): each hospital's querier and what its rounds
// charged the others, whichever gateway it runs over; hidden when there is none.
async function refreshLoops() {
  const section = document.getElementById("loops-section");
  let reply;
  try { reply = await get("/v1/admin/loops"); } catch (e) { section.hidden = true; return; }
  section.hidden = reply.loops.length === 0;
  fill("loops", reply.loops.map(l => [
    l.hospital, l.querier,
    Object.entries(l.epsilon_by_party).map(([p, e]) => `${p}: ${e.toFixed(4)}`).join(", ") || "none yet",
    l.epsilon_spent.toFixed(4),
  ]));
}

async function refresh() {
  refreshLoop();
  refreshLoops();
  const status = document.getElementById("status");
  try {
    const [history, parties, jobs, audits, log] = await Promise.all([
      get("/v1/admin/budgets/history"), get("/v1/admin/parties"), get("/v1/jobs?limit=20"),
      get("/v1/admin/privacy-audits?limit=100"), get("/v1/admin/audit?limit=1"),
    ]);
    // Newest first: the first audit seen of a party is its latest.
    const latest = {};
    for (const a of audits.audits) if (!(a.party in latest)) latest[a.party] = a;
    drawChart(history);
    const answerers = parties.parties.filter(p => p.role === "answerer");
    fill("budgets", answerers.map(p => [
      p.name, p.connected ? "yes" : "no", p.epsilon_spent.toFixed(4), trainings(p),
      p.own_ledger.state === "unreported" ? "" : p.own_ledger.epsilon_spent.toFixed(4),
      p.ledger_delta.toPrecision(3), p.full_delta.toPrecision(12), p.rounds_asked,
      ledgerState(p), p.epsilon_cap, p.declared_cap === null ? "" : p.declared_cap,
      p.epsilon_remaining.toFixed(4), p.queries_left === null ? "" : p.queries_left,
      p.name in latest ? interval(latest[p.name]) : "not audited", p.last_seen || "",
    ]));
    fill("audits", audits.audits.map(a => [
      a.party, a.claimed_epsilon.toFixed(4), interval(a), `${a.correct} / ${a.guesses} / ${a.canaries}`,
      verdict(a), a.attack, a.at.slice(0, 19),
    ]));
    // Per (querier, party) pair over the whole audit log; either side can fail a check.
    fill("disputes", log.disputes.map(d => [
      d.querier, d.party, d.failures, d.party_queriers, d.querier_parties, d.points_to,
    ]));
    const diverged = answerers.filter(p => p.own_ledger.state === "diverged").map(p => p.name);
    const alert = document.getElementById("divergence");
    alert.hidden = diverged.length === 0;
    alert.textContent = diverged.length ? `Ledgers disagree for ${diverged.join(", ")}: the guardian's ledger and the hospital's own count different spends.` : "";
    fill("jobs", jobs.jobs.map(j => [
      j.id.slice(0, 8), j.state + (j.error ? `: ${j.error}` : ""), progress(j.progress),
      `${j.answered} / ${j.processed}`, j.rounds, j.created_at.slice(0, 19),
    ]));
    status.className = "sub";
    status.textContent = `ledger δ = ${history.delta}, each party's guarantee (ε, δ with the noise cut-off + R·2⁻⁴⁰); updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    status.className = "error";
    status.textContent = `could not load: ${err.message}`;
    if (String(err.message).startsWith("401")) document.getElementById("login").hidden = false;
  }
}

document.getElementById("save").addEventListener("click", () => {
  sessionStorage.setItem("capc-token", document.getElementById("token").value.trim());
  document.getElementById("login").hidden = true;
  refresh();
});
if (!token()) document.getElementById("login").hidden = false;
refresh();
setInterval(refresh, 5000);
