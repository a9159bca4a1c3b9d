// The sampled tokens of a turn, coloured by rollout log-prob, trainer log-prob, or their
// difference. Low probability is red; in the difference view blue means the trainer gives
// the token more probability than the engine did, orange less.
"use strict";

const TOKEN_MODES = [
  ["rollout", "rollout log-prob"],
  ["trainer", "trainer log-prob"],
  ["diff", "trainer − rollout"],
];

function tokenColor(mode, lp, tlp) {
  if (mode === "diff") {
    if (tlp === null || tlp === undefined) return null;
    const d = tlp - lp, a = Math.min(Math.abs(d) / 0.5, 1) * 0.85;
    return d >= 0 ? `rgba(37,99,235,${a.toFixed(3)})` : `rgba(234,88,12,${a.toFixed(3)})`;
  }
  const v = mode === "trainer" ? tlp : lp;
  if (v === null || v === undefined) return null;
  const a = (1 - Math.exp(v)) * 0.85;
  return `rgba(220,38,38,${a.toFixed(3)})`;
}

function tokenView(turn, mode) {
  const wrap = h("div", { class: "tokens", "data-mode": mode });
  const ids = turn.completion_ids, lps = turn.logprobs || [], tlps = turn.trainer_logprobs;
  for (let i = 0; i < ids.length; i++) {
    const piece = turn.pieces ? turn.pieces[i] : `‹${ids[i]}›`;
    const lp = lps[i], tlp = tlps ? tlps[i] : null;
    const color = tokenColor(mode, lp, tlp);
    const tip = [`#${i} id ${ids[i]}`, `rollout ${fmt(lp, 4)} (p=${fmt(Math.exp(lp), 3)})`];
    if (tlp !== null && tlp !== undefined) tip.push(`trainer ${fmt(tlp, 4)} (p=${fmt(Math.exp(tlp), 3)})`, `Δ ${fmt(tlp - lp, 4)}`);
    const span = h("span", { class: color ? "tok" : "tok na", title: tip.join(" · ") },
      piece.replace(/\n/g, "↵\n"));
    if (color) span.style.background = color;
    wrap.append(span);
  }
  if (!ids.length) wrap.append(h("span", { class: "muted" }, "(no completion tokens)"));
  return wrap;
}

function tokenLegend(mode) {
  if (mode === "diff")
    return h("span", { class: "legend-scale" }, h("i", { class: "sw", style: { background: "rgba(234,88,12,.85)" } }),
      "trainer lower", h("i", { class: "sw", style: { background: "#fff" } }), "equal",
      h("i", { class: "sw", style: { background: "rgba(37,99,235,.85)" } }), "trainer higher (|Δ| ≥ 0.5 saturates)");
  return h("span", { class: "legend-scale" }, h("i", { class: "sw", style: { background: "#fff" } }), "p = 1",
    h("i", { class: "sw", style: { background: "rgba(220,38,38,.45)" } }), "p = 0.5",
    h("i", { class: "sw", style: { background: "rgba(220,38,38,.85)" } }), "p → 0");
}
