"""The status page the web app serves at `/`: one self-contained HTML document.

Owns: the page's markup, style and script, as one constant. No external assets, no build
step: the script fetches the JSON endpoints (`/pool-list`, `/request-list`, `/events`)
with `Accept: application/json`, one request at a time (each abandoned after 10 s, the next
round planned 5 s after the last one ended, so the page never has two requests in flight),
shows when the launcher marks its answer stale, and renders one card per running pool
(whichever launchers serve it: `/pool-list` combines their statuses, and the card lists
them, a paused or not ready one noted; its conditions, green/red/yellow by status, grey
when `neutral`: a pause, a drain, something switched off; usage against limits, nodes by
state, launches and queued requests, suspended labels), the request counts and the most
recent lifecycle events. The JSON endpoints stay the source of truth; the page only shows
them, and shows the error when they fail. Readable on a phone (one column below 40em).
Text is inserted with `textContent` only, never as HTML.
"""

from __future__ import annotations

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>nodepool-k8s status</title>
<style>
:root { --ok: #1b7f3b; --bad: #b3261e; --unk: #7a6a00; --off: #6b7280; --fg: #1d1d1f;
        --muted: #666;
        --card: #fff; --bg: #f3f4f6; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
       color: var(--fg); background: var(--bg); }
header { padding: .8em 1em; background: #22303c; color: #fff; display: flex;
         flex-wrap: wrap; gap: .5em 1.5em; align-items: baseline; }
header h1 { font-size: 1.15em; margin: 0; }
header span { color: #cfd8dc; font-size: .9em; }
main { padding: 1em; display: grid; gap: 1em;
       grid-template-columns: repeat(auto-fill, minmax(22em, 1fr)); }
.card { background: var(--card); border-radius: 8px; padding: .8em 1em;
        box-shadow: 0 1px 3px rgba(0,0,0,.12); min-width: 0; }
.card h2 { font-size: 1.05em; margin: 0 0 .2em; overflow-wrap: anywhere; }
.sub { color: var(--muted); font-size: .85em; overflow-wrap: anywhere; }
.conds { display: flex; flex-wrap: wrap; gap: .35em; margin: .6em 0; }
.cond { border-radius: 4px; padding: .15em .5em; font-size: .85em; color: #fff; }
.cond.True { background: var(--ok); } .cond.False { background: var(--bad); }
.cond.Unknown { background: var(--unk); }
.cond.Suspended.True { background: var(--bad); } .cond.Suspended.False { background: var(--ok); }
.cond.Drifted.True { background: var(--unk); } .cond.Drifted.False { background: var(--ok); }
.cond.neutral, .cond.neutral.True, .cond.neutral.False { background: var(--off); }
table { border-collapse: collapse; width: 100%; font-size: .9em; margin: .4em 0; }
td, th { text-align: left; padding: .15em .3em; border-bottom: 1px solid #eee; }
.bar { height: .5em; background: #e5e7eb; border-radius: 3px; overflow: hidden; }
.bar div { height: 100%; background: #3b82f6; }
.bar div.full { background: var(--bad); }
.msg { font-size: .85em; color: var(--muted); margin: .1em 0; overflow-wrap: anywhere; }
.suspended { color: var(--bad); font-size: .9em; }
#error { display: none; margin: 1em; padding: .8em; background: #fde8e8; color: var(--bad);
         border-radius: 6px; }
#events-section { padding: 0 1em 1em; overflow-x: auto; }
#events td { font-size: .85em; } #events-section h2 { font-size: 1.1em; }
@media (max-width: 40em) { main { grid-template-columns: 1fr; padding: .5em; } }
</style>
</head>
<body>
<header><h1>nodepool-k8s</h1><span id="summary">loading&hellip;</span>
<span id="updated"></span></header>
<div id="error" role="alert"></div>
<main id="pools"></main>
<section id="events-section"><h2>Recent events</h2><table id="events"></table></section>
<script>
"use strict";
const REFRESH_MS = 5000;
const TIMEOUT_MS = 10000;
const EVENTS_SHOWN = 20;
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
let stale = "";
// One request at a time, each given up after TIMEOUT_MS: a slow or stalled launcher never
// collects a queue of this page's requests.
async function getJSON(path) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), TIMEOUT_MS);
  try {
    const r = await fetch(path, {headers: {"Accept": "application/json"}, cache: "no-store",
                                 signal: abort.signal});
    if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()).trim());
    const why = r.headers.get("X-Status-Stale");
    if (why) stale = " (stale: " + why + ", " + r.headers.get("X-Status-Age") + "s old)";
    return await r.json();
  } catch (e) {
    if (e.name === "AbortError") throw new Error(path + ": no answer within " +
                                                 TIMEOUT_MS / 1000 + "s");
    throw e;
  } finally {
    clearTimeout(timer);
  }
}
function ago(t) {
  if (typeof t !== "number") return "";
  const s = Math.max(0, Math.round(Date.now() / 1000 - t));
  if (s < 120) return s + "s ago";
  if (s < 7200) return Math.round(s / 60) + "m ago";
  return Math.round(s / 3600) + "h ago";
}
function poolCard(p) {
  const card = el("section", "card pool");
  card.dataset.provider = p.provider || ""; card.dataset.pool = p.pool || "";
  card.appendChild(el("h2", null, (p.provider || "?") + " / " + (p.pool || "?")));
  // One card per pool, whichever launchers serve it: each listed, paused or not ready noted.
  const served = (p.launchers || [{hostname: p.hostname, id: p.id}]).map(l => {
    const notes = [l.paused ? "paused" : "", l.ready === false ? "not ready" : ""]
      .filter(x => x);
    return (l.hostname || l.id || "?") + (notes.length ? " (" + notes.join(", ") + ")" : "");
  });
  const sub = el("div", "sub launchers", "Launchers: " + served.join(", "));
  sub.title = (p.launchers || []).map(l => l.id).join(", ");
  card.appendChild(sub);
  const conds = el("div", "conds");
  for (const c of p.conditions || []) {
    // A state the operator chose (paused, draining, disabled) is grey: neither ok nor bad.
    const b = el("span", "cond " + c.type + " " + c.status + (c.neutral ? " neutral" : ""),
                 c.type + ": " + c.reason);
    const since = c.last_transition ? " (since " + ago(c.last_transition) + ")" : "";
    b.title = (c.message || "") + since;
    conds.appendChild(b);
  }
  card.appendChild(conds);
  for (const c of p.conditions || []) {
    if (c.message && (c.status !== "True" || c.type === "Quota" || c.type === "Drifted"))
      card.appendChild(el("p", "msg", c.type + ": " + c.message));
  }
  for (const [label, s] of Object.entries(p.suspended || {}))
    card.appendChild(el("p", "suspended", "Suspended " + label + ": " + (s.reason || "") +
      " after " + (s.failures || 0) + " failures"));
  const usage = p.usage || [];
  if (usage.length) {
    const t = el("table", "usage");
    const head = el("tr"); ["Limit", "Used", ""].forEach(h => head.appendChild(el("th", null, h)));
    t.appendChild(head);
    for (const u of usage) {
      const tr = el("tr");
      tr.appendChild(el("td", null, u.scope + " " + u.resource));
      tr.appendChild(el("td", null, u.used + " / " + u.limit));
      const td = el("td"); const bar = el("div", "bar"); const fill = el("div");
      const frac = u.limit > 0 ? Math.min(1, u.used / u.limit) : 1;
      fill.style.width = Math.round(frac * 100) + "%";
      if (frac >= 1) fill.className = "full";
      bar.appendChild(fill); td.appendChild(bar); tr.appendChild(td); t.appendChild(tr);
    }
    card.appendChild(t);
  }
  const counts = el("table", "counts");
  const nodes = Object.entries(p.nodes || {});
  const rows = [["Nodes", nodes.length ? nodes.map(([k, v]) => k + " " + v).join(", ") : "none"],
                ["Launches in progress", p.launches_in_progress],
                ["Requests waiting", p.requests_queued]];
  for (const [k, v] of rows) {
    const tr = el("tr"); tr.appendChild(el("th", null, k)); tr.appendChild(el("td", null, v));
    counts.appendChild(tr);
  }
  card.appendChild(counts);
  return card;
}
async function refresh() {
  const err = document.getElementById("error");
  try {
    stale = "";
    const pools = await getJSON("pool-list");
    const requests = await getJSON("request-list");
    const events = await getJSON("events");
    const table = document.getElementById("events");
    const header = el("tr");
    for (const h of ["Time", "Kind", "Pool", "Node", "Reason", "Message"])
      header.appendChild(el("th", null, h));
    const rows = events.slice(-EVENTS_SHOWN).reverse().map((e) => {
      const tr = el("tr");
      for (const v of [e.when, e.kind, (e.provider || "") + (e.pool ? "/" + e.pool : ""),
                       e.node, e.reason, e.message])
        tr.appendChild(el("td", null, v == null ? "" : String(v)));
      return tr;
    });
    table.replaceChildren(header, ...rows);
    if (!rows.length) table.replaceChildren(el("tr", null, "No recent events."));
    const main = document.getElementById("pools");
    main.replaceChildren(...pools.map(poolCard));
    if (!pools.length) main.appendChild(el("p", "msg", "No pool is running."));
    const states = {};
    for (const r of requests) states[r.state] = (states[r.state] || 0) + 1;
    document.getElementById("summary").textContent = pools.length + " pool(s); requests: " +
      (Object.entries(states).map(([k, v]) => k + " " + v).join(", ") || "none");
    document.getElementById("updated").textContent =
      "updated " + new Date().toLocaleTimeString() + stale;
    err.style.display = "none";
    document.body.dataset.loaded = "1";
  } catch (e) {
    err.textContent = "Could not refresh: " + e.message;
    err.style.display = "block";
  }
  // The next poll is planned only once this one has finished (or given up).
  setTimeout(refresh, REFRESH_MS);
}
refresh();
</script>
</body>
</html>
"""
