// The status page: `legorl status` live (api/status, legorl/ops/status.py). Which run is
// alive, how far it has got, and each known failure signature that matches, with the
// evidence it read and its fix; "no known signature matched" otherwise. Re-read when new
// metrics, alerts or trajectories arrive, and every 15 s (the stall clock moves on its own).
"use strict";

const StatusPage = {
  timer: null,
  async render() {
    clearInterval(StatusPage.timer);
    StatusPage.timer = setInterval(() => { if (S.page === StatusPage) StatusPage.refresh(); }, 15000);
    const root = h("div", { id: "status" });
    await StatusPage.fill(root);
    return root;
  },
  async fill(root) {
    let r;
    try {
      r = await api("api/status");
    } catch (e) {
      root.replaceChildren(h("p", { class: "error" }, `No status: ${e.message}`));
      return;
    }
    const p = r.progress, proc = r.process;
    const mins = (s) => `${(s / 60).toFixed(1)} min`;
    const cards = h("div", { class: "cards" },
      h("div", { class: "card", "data-k": "state" }, h("div", { class: "v" }, r.state), h("div", { class: "l" },
        proc.pid ? `pid ${proc.pid} ${proc.state}` : `process ${proc.state}`)),
      h("div", { class: "card", "data-k": "steps" }, h("div", { class: "v" }, `${p.steps_done}/${p.steps_planned}`), h("div", { class: "l" }, "steps done")),
      h("div", { class: "card", "data-k": "pace" }, h("div", { class: "v" }, p.minutes_per_step === null ? "—" : p.minutes_per_step.toFixed(2)), h("div", { class: "l" }, "min / step")),
      h("div", { class: "card", "data-k": "elapsed" }, h("div", { class: "v" }, mins(p.elapsed_s)), h("div", { class: "l" }, "elapsed")),
      h("div", { class: "card", "data-k": "last-write" }, h("div", { class: "v" }, mins(p.last_write_age_s) + " ago"), h("div", { class: "l" }, `last write ${p.last_write}`)));
    const verdict = h("h2", { class: r.sick ? "error" : "", "data-verdict": r.verdict }, r.sick ? `Sick: ${r.summary}` : r.summary);
    const sigs = r.signatures.map((m) => h("section", { class: "signature", "data-signature": m.key },
      h("h3", {}, h("span", { class: `badge sev-${m.severity}` }, m.severity), " ", m.name),
      h("ul", {}, m.evidence.map((e) => h("li", { class: "evidence" }, e))),
      h("p", { class: "fix" }, h("b", {}, "fix: "), m.fix)));
    root.replaceChildren(cards, verdict, ...sigs,
      h("p", { class: "muted" }, `Read-only, from the run store and the run directory's lock (${proc.source || "lock"}). The same report: legorl status ${r.run_dir}`));
  },
  refresh: debounce(() => {
    const root = document.getElementById("status");
    if (root && S.page === StatusPage) StatusPage.fill(root);
  }, 1000),
  onMetrics() { StatusPage.refresh(); },
  onAlert() { StatusPage.refresh(); },
  onTrajectory() { StatusPage.refresh(); },
};
