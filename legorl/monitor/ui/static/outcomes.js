// The rollout-outcome view: one step's rollouts by what they gave the trainer (api/outcomes,
// legorl/ops/outcomes.py): gradient, zero-variance group, advantage 0, masked (infrastructure),
// filtered (stale, abandoned), each with why; then the step's token ledger (ledger.js). Redrawn
// when the step's trajectories change.
"use strict";

const KIND_LABELS = { gradient: "gradient", zero_variance: "zero-variance", zero_advantage: "advantage 0",
  masked: "masked", filtered: "filtered", pending: "not graded yet" };

const OutcomesPage = {
  step: null,
  async render(params) {
    const step = params.get("step") ?? String(S.run.last_step ?? "");
    OutcomesPage.step = step;
    const steps = [];
    for (let s = Math.max(S.run.first_step ?? 0, 0); s <= (S.run.last_step ?? -1); s++) steps.push(s);
    const picker = h("select", { onchange: (e) => setHash("/outcomes", { step: e.target.value }) },
      steps.map((s) => h("option", { value: s, selected: String(s) === step }, `step ${s}`)));
    const root = h("div", { id: "outcomes" }, h("div", { class: "filters" }, "Rollouts of ", picker), h("div", { class: "body" }));
    if (step !== "") await OutcomesPage.fill(root, step);
    return root;
  },
  async fill(root, step) {
    const [o, led] = await Promise.all([api(`api/outcomes?step=${encodeURIComponent(step)}`),
      api(`api/ledger?step=${encodeURIComponent(step)}`)]);
    const counts = h("div", { class: "cards" }, Object.entries(o.counts).filter(([k, n]) => n || k === "gradient").map(([k, n]) =>
      h("div", { class: `card kind-${k}`, "data-kind": k }, h("div", { class: "v" }, n), h("div", { class: "l" }, KIND_LABELS[k]))));
    const table = h("table", { class: "grid outcomes" },
      h("tr", {}, ["task", "rollout", "status", "reward", "advantage", "gave", "why"].map((c) => h("th", {}, c))),
      o.rollouts.map((r) => h("tr", { "data-kind": r.kind, "data-session": r.session_id },
        h("td", {}, r.instance_id), h("td", {}, h("a", { href: `#/t/${encodeURIComponent(r.session_id)}` }, r.session_id.slice(-6))),
        h("td", {}, r.status || "—"), h("td", { class: "num" }, fmt(r.reward)), h("td", { class: "num" }, fmt(r.advantage)),
        h("td", {}, h("span", { class: `badge kind-${r.kind}` }, KIND_LABELS[r.kind])), h("td", { class: "why" }, r.why))));
    root.querySelector(".body").replaceChildren(counts, table, h("h2", {}, "Token ledger"), ledgerView(led));
  },
  refresh: debounce(() => {
    const root = document.getElementById("outcomes");
    if (root && S.page === OutcomesPage && OutcomesPage.step !== "") OutcomesPage.fill(root, OutcomesPage.step);
  }, 1000),
  onTrajectory(row) { if (String(row.step) === OutcomesPage.step) OutcomesPage.refresh(); },
};
