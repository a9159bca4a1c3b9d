// The token ledger (api/ledger, legorl/ledger.py): where a step's sampled tokens went, per
// harness: trained, or not and why. A row whose columns do not add up to its sampled tokens
// says so, in red: some tokens went somewhere nobody counted.
"use strict";

const LEDGER_LABELS = { aborted: "aborted call", side_call: "side call", unplaced: "unplaced",
  infra_mask: "infra mask", zero_variance: "zero-variance group", stale: "stale" };

function ledgerView(l) {
  const names = Object.keys(l.harnesses);
  if (!names.length) return h("p", { class: "muted" }, "No token ledger for this step (it is written when the step trains).");
  const cols = ["sampled", "trained", ...l.reasons];
  const pct = (n, of) => (of ? ` (${(100 * n / of).toFixed(1)}%)` : "");
  const row = (name, r, cls) => h("tr", { class: cls, "data-harness": name },
    h("td", {}, name), cols.map((c) => h("td", { class: "num", "data-col": c }, `${r[c]}${c === "sampled" ? "" : pct(r[c], r.sampled)}`)),
    h("td", { class: r.balanced ? "" : "error", "data-col": "balanced" }, r.balanced ? "100%" : "does not add up"));
  return h("section", { class: "ledger" },
    h("table", { class: "grid ledger-table" },
      h("tr", {}, h("th", {}, "harness"), cols.map((c) => h("th", {}, c === "sampled" || c === "trained" ? c : `not trained: ${LEDGER_LABELS[c] || c}`)),
        h("th", {}, "accounted")),
      names.map((n) => row(n, l.harnesses[n], "")), names.length > 1 ? row("all", l.total, "total") : ""),
    h("p", { class: "muted" }, "Completion tokens the policy sampled; each not-trained token under the first reason that applies."));
}
