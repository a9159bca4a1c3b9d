// Tiny DOM helpers. Everything the harness or the model wrote is untrusted text, so it is
// only ever put into the page with textContent (never innerHTML).
"use strict";

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

async function api(path) {
  const r = await fetch(path);
  const body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (!r.ok) throw new Error(body.error || JSON.stringify(body.detail || body));
  return body;
}

function fmt(v, digits = 3) {
  if (v === null || v === undefined) return "—";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  return Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(digits);
}

function statusBadge(status, masked) {
  const s = status || "running";
  return h("span", { class: `badge st-${s}${masked ? " masked" : ""}`, title: masked ? "masked from the loss" : null }, s);
}

function flagBadges(flags) {
  return (flags || []).map((f) => h("span", { class: "badge flag" }, f));
}

function hashParams() {
  const [path, query] = location.hash.slice(1).split("?");
  return { path: path || "/", params: new URLSearchParams(query || "") };
}

function setHash(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined) q.set(k, v);
  const s = q.toString();
  location.hash = `#${path}${s ? "?" + s : ""}`;
}

function debounce(fn, ms) {
  let t = null;
  return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); };
}

// Run-store steps below 0 are phases of the run (legorl/store/phases.py), not GSPO steps.
const HELDOUT_STEP = -2;
const PHASE_NAMES = { [-2]: "held-out evaluation", [-1]: "warm start" };

function stepLabel(step, long = false) {
  if (step === null || step === undefined) return "—";
  if (step < 0) return PHASE_NAMES[step] || `phase ${step}`;
  return long ? `step ${step}` : String(step);
}
