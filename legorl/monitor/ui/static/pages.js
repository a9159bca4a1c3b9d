// Overview, trajectory list, groups and compare pages. Each page is {render(params), on*}
// hooks the live stream calls (see app.js).
"use strict";

const CHARTS = [
  { title: "Reward & resolved rate", keys: ["reward/mean", "resolved_rate"] },
  { title: "Failure classes (share of rollouts)", prefix: "status/", exclude: ["status/resolved"], alert: "infra_errors" },
  { title: "Rollout/trainer prob correlation", keys: ["mismatch/pearson"], refs: [{ y: 0.99, label: "monitor threshold 0.99" }], zero: false, alert: "mismatch" },
  { title: "Mean |p_rollout − p_trainer|", keys: ["mismatch/mean_abs_dp"], alert: "mismatch" },
  { title: "Clip fraction", keys: ["train/clip_frac"] },
  { title: "Entropy", keys: ["train/entropy"] },
  { title: "Response tokens (mean)", keys: ["rollout/response_tokens_mean"], alert: "length_blowup" },
  { title: "Turns (mean)", keys: ["rollout/turns_mean"], alert: "length_blowup" },
  { title: "Tool use", keys: ["rollout/action_rate", "rollout/unparsed_end_rate", "rollout/tool_call_rate", "rollout/format_error_rate"], alert: "tool_collapse", legend: true },
  { title: "Parse failures (share of turns)", keys: ["rollout/parse_failure_rate"], prefix: "rollout/parse_failure_rate/", exclude: [], keepZero: true, alert: "parse_failures", legend: true, threshold: "parse_failure_rate_warn" },
  { title: "Zero-variance groups (share)", keys: ["groups/zero_variance_share"], alert: "zero_variance" },
  { title: "Policy staleness (versions)", keys: ["policy/staleness_mean"], alert: "staleness" },
  { title: "Tamper flags", keys: ["rollout/tamper_flags"], alert: "tamper" },
];

function chartKeys(def, all) {
  if (!def.prefix) return def.keys;
  return (def.keys || []).concat(all.filter((k) => k.startsWith(def.prefix) && !def.exclude.includes(k) &&
    (def.keepZero || (S.metrics[k] || []).some((p) => p[1]))));
}

// A metric's meaning; a per-harness key (`rollout/parse_failure_rate/<harness>`) has its family's.
function metricDoc(k) {
  const docs = S.run.metric_docs || {};
  return docs[k] || docs[k.replace(/\/[^/]+$/, "/<harness>")] || "";
}

// The reference line of a chart whose monitor threshold is in the run's [monitor] config.
function chartRefs(def) {
  if (!def.threshold) return def.refs;
  const y = ((S.run.config || {}).monitor || {})[def.threshold] ?? DEFAULT_THRESHOLDS[def.threshold];
  return y === undefined ? def.refs : [{ y, label: `monitor threshold ${y}` }];
}
const DEFAULT_THRESHOLDS = { parse_failure_rate_warn: 0.05 };

const HELDOUT_ROWS = [["start", "start (untrained)"], ["warm_start", "warm start"], ["end", "end (after GSPO)"],
  ["control", "control (more SFT instead of GSPO)"]];
const GAIN_NAMES = { gspo_over_warm_start: "GSPO over its warm start", gspo_over_start: "GSPO over the start",
  control_over_warm_start: "control over the warm start" };
const pct = (v) => `${(100 * v).toFixed(1)}%`;

// The held-out before/after table: the run's headline (heldout_results.json / the store's heldout event).
function heldoutView(rep) {
  const evals = (rep && rep.evaluations) || {};
  if (!Object.keys(evals).length) return h("p", { class: "muted" }, "No held-out evaluation yet.");
  const known = HELDOUT_ROWS.filter(([k]) => evals[k]);
  const extra = Object.keys(evals).filter((k) => !HELDOUT_ROWS.some(([r]) => r === k)).map((k) => [k, k]);
  const rows = known.concat(extra).map(([k, label]) => {
    const e = evals[k];
    return h("tr", { "data-label": k }, h("td", {}, label), h("td", { class: "num big" }, pct(e.resolved_rate)),
      h("td", { class: "num" }, `[${pct(e.ci95[0])}, ${pct(e.ci95[1])}]`), h("td", { class: "num" }, `${e.resolved}/${e.episodes}`),
      h("td", { class: "num" }, e.masked), h("td", { class: "num" }, `v${e.policy_version ?? "—"}`));
  });
  const gains = Object.entries(rep.gains || {}).map(([k, g]) => h("li", { "data-gain": k },
    `${GAIN_NAMES[k] || k}: `, h("b", {}, `${g.points >= 0 ? "+" : ""}${g.points.toFixed(1)} points`),
    ` [${g.ci95[0] >= 0 ? "+" : ""}${g.ci95[0].toFixed(1)}, ${g.ci95[1] >= 0 ? "+" : ""}${g.ci95[1].toFixed(1)}]`,
    g.ci95[0] > 0 ? h("span", { class: "badge v-improved" }, "interval above 0") : ""));
  return h("div", { class: "heldout" },
    h("table", { class: "grid heldout-table" }, h("tr", {}, ["checkpoint", "held-out resolved", "95% interval",
      "resolved / graded", "masked", "policy"].map((c) => h("th", {}, c))), rows),
    gains.length ? h("ul", { class: "gains" }, gains) : "",
    h("p", { class: "muted" }, "95% Wilson intervals; gains in points with Newcombe's interval.",
      rep.wall_s !== undefined ? ` Whole run ${rep.wall_s.toFixed(0)} s${rep.time_budget_s ? ` (budget ${rep.time_budget_s.toFixed(0)} s)` : ""}.` : ""));
}

const OverviewPage = {
  async render() {
    this.root = h("div", { class: "overview" });
    this.cards = h("div", { class: "cards" });
    this.heldout = h("section", { class: "heldout-box" });
    this.formats = h("p", { class: "muted formats" });
    this.charts = h("div", { class: "charts" });
    this.other = h("div", { class: "charts" });
    this.alertBox = h("div", {});
    this.root.append(this.cards, h("h2", {}, "Held-out evaluation"), this.heldout, h("h2", {}, "Training curves"),
      this.formats, this.charts, h("h2", {}, "Alerts"), this.alertBox,
      h("details", {}, h("summary", {}, "Other metrics"), this.other));
    this.draw();
    await this.loadHeldout();
    return this.root;
  },
  async loadHeldout() {
    try { this.heldout.replaceChildren(heldoutView(await api("api/heldout"))); }
    catch (e) { this.heldout.replaceChildren(h("p", { class: "error" }, e.message)); }
  },
  draw() {
    const r = S.run, counts = r.status_counts || {};
    const graded = Object.entries(counts).filter(([k]) => k !== "running").reduce((a, [, v]) => a + v, 0);
    const card = (label, value, cls) => h("div", { class: `card ${cls || ""}` }, h("div", { class: "v" }, value), h("div", { class: "l" }, label));
    this.cards.replaceChildren(
      card("trajectories", r.trajectories), card("turns", r.turns),
      card("GSPO steps", r.last_step === null ? "—" : `${r.first_step}–${r.last_step}`, "steps"),
      (r.phases || []).length ? h("div", { class: "card phases" }, h("div", { class: "v" }, r.phases.map((p) => p.name).join(" · ")),
        h("div", { class: "l" }, `phases before GSPO: ${r.phases.map((p) => `${p.name} ${p.trajectories} rollouts`).join(", ")}`)) : "",
      card("resolved", graded ? `${((counts.resolved || 0) / graded * 100).toFixed(1)}%` : "—"),
      card("running", counts.running || 0),
      card("alerts", S.alerts.length, S.alerts.some((a) => a.severity === "critical") ? "bad" : ""),
      h("div", { class: "status-bar" }, Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([k, v]) =>
        h("a", { href: `#/trajectories?status=${k}`, class: `badge st-${k}` }, `${k} ${v}`))));
    const formats = Object.entries((r.info || {}).action_formats || {});
    this.formats.replaceChildren(formats.length ? `How each harness acts (what counts as a parse failure): ${formats.map(([n, f]) => `${n}: ${f.label}`).join("; ")}` : "");
    const all = Object.keys(S.metrics).sort(), used = new Set();
    this.charts.replaceChildren(...CHARTS.map((def) => {
      const keys = chartKeys(def, all);
      keys.forEach((k) => used.add(k));
      if (def.prefix) all.filter((k) => k.startsWith(def.prefix)).forEach((k) => used.add(k));
      const marks = S.alerts.filter((a) => a.name === def.alert).map((a) => ({ step: a.step, severity: a.severity, text: a.message }));
      return lineChart(def.title, keys.map((k) => ({ name: k, points: S.metrics[k] || [] })),
        { refs: chartRefs(def), zero: def.zero, marks, legend: def.legend, doc: keys.map((k) => `${k}: ${metricDoc(k)}`).join("\n") });
    }));
    // the token ledger's counts have their own table (the Outcomes view), not a chart each
    this.other.replaceChildren(...all.filter((k) => !used.has(k) && !k.startsWith("ledger/")).map((k) => lineChart(k, [{ name: k, points: S.metrics[k] }])));
    const rows = S.alerts.slice().reverse().slice(0, 100);
    this.alertBox.replaceChildren(rows.length ? h("table", { class: "grid alerts" },
      h("tr", {}, h("th", {}, "step"), h("th", {}, "monitor"), h("th", {}, "severity"), h("th", {}, "message")),
      rows.map((a) => h("tr", { class: `sev-${a.severity}` }, h("td", {}, a.step), h("td", {}, a.name),
        h("td", {}, h("span", { class: `badge sev-${a.severity}` }, a.severity)), h("td", {}, a.message))))
      : h("p", { class: "muted" }, "No alerts."));
  },
  onMetrics() { this.redraw(); },
  onAlert() { this.redraw(); },
  onRun() { this.redraw(); },
  onTrajectory(row) { if (row.step === HELDOUT_STEP && row.status) this.reloadHeldout(); },
  onEvent(ev) { if (ev.kind === "heldout") this.reloadHeldout(); },
  redraw: debounce(() => { if (S.page === OverviewPage) OverviewPage.draw(); }, 250),
  reloadHeldout: debounce(() => { if (S.page === OverviewPage) OverviewPage.loadHeldout(); }, 500),
};

const STATUSES = ["resolved", "failed", "no_patch", "agent_timeout", "max_turns", "format_error", "agent_crash",
  "hack_detected", "sandbox_start_failed", "engine_error", "grader_error", "infra_error"];
const FILTERS = ["status", "harness", "task", "step", "min_reward", "max_reward", "flag", "q"];

function trajRow(r, fresh) {
  return h("tr", { class: `row${fresh ? " fresh" : ""}`, "data-sid": r.session_id, onclick: () => setHash(`/t/${encodeURIComponent(r.session_id)}`, {}) },
    h("td", {}, r.id), h("td", { class: "mono" }, h("a", { href: `#/t/${encodeURIComponent(r.session_id)}` }, r.session_id)),
    h("td", {}, stepLabel(r.step)), h("td", {}, r.instance_id || "—"), h("td", {}, r.harness || "—"),
    h("td", {}, statusBadge(r.status, r.masked)), h("td", { class: "num" }, fmt(r.reward)),
    h("td", { class: "num" }, fmt(r.advantage)), h("td", { class: "num" }, r.n_turns),
    h("td", { class: "num" }, r.completion_tokens), h("td", {}, flagBadges(r.flags)));
}

const ListPage = {
  async render(params) {
    this.params = params;
    const f = Object.fromEntries(FILTERS.map((k) => [k, params.get(k) || ""]));
    const sel = (name, opts) => h("select", { name }, h("option", { value: "" }, `any ${name}`),
      opts.map((o) => h("option", { value: o, selected: f[name] === o }, o)));
    const inp = (name, ph, type = "text", size = 8) => h("input", { name, placeholder: ph, value: f[name], type, size, step: type === "number" ? "any" : null });
    this.form = h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); this.apply(); } },
      sel("status", ["running", "infra", ...STATUSES]), sel("harness", S.run.harnesses), inp("task", "task (instance_id)", "text", 22),
      inp("step", "step", "number", 5), inp("min_reward", "min reward", "number", 6), inp("max_reward", "max reward", "number", 6),
      sel("flag", ["any", ...S.run.flags]), inp("q", "search turn text and diffs", "search", 26),
      h("button", { type: "submit" }, "Filter"), h("button", { type: "button", onclick: () => setHash("/trajectories", {}) }, "Clear"));
    this.form.querySelectorAll("select").forEach((s) => s.addEventListener("change", () => this.apply()));
    this.info = h("div", { class: "list-info" });
    this.body = h("tbody", {});
    this.pager = h("div", { class: "pager" });
    const head = ["#", "session", "step", "task", "harness", "status", "reward", "adv", "turns", "tokens", "flags"];
    const root = h("div", {}, this.form, this.info,
      h("table", { class: "grid trajs" }, h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))), this.body), this.pager);
    await this.load();
    return root;
  },
  apply() {
    const p = {};
    for (const k of FILTERS) p[k] = this.form.elements[k].value.trim();
    setHash("/trajectories", p);
  },
  query(extra = {}) {
    const q = new URLSearchParams();
    for (const k of FILTERS) if (this.params.get(k)) q.set(k, this.params.get(k));
    if (this.params.get("cursor")) q.set("cursor", this.params.get("cursor"));
    for (const [k, v] of Object.entries(extra)) q.set(k, v);
    return q;
  },
  async load(freshIds) {
    let page;
    try { page = await api(`api/trajectories?${this.query({ limit: 50 })}`); }
    catch (e) { this.info.replaceChildren(h("span", { class: "error" }, e.message)); this.body.replaceChildren(); return; }
    this.info.replaceChildren(`${page.total} matching`, this.params.get("cursor") ? ` · page after #${this.params.get("cursor")}` : "");
    this.body.replaceChildren(...page.items.map((r) => trajRow(r, freshIds && freshIds.has(r.id))));
    const base = Object.fromEntries(FILTERS.map((k) => [k, this.params.get(k)]));
    this.pager.replaceChildren(
      this.params.get("cursor") ? h("a", { href: "#", onclick: (e) => { e.preventDefault(); setHash("/trajectories", base); } }, "⇤ newest") : "",
      page.next_cursor ? h("a", { href: "#", class: "older", onclick: (e) => { e.preventDefault(); setHash("/trajectories", { ...base, cursor: page.next_cursor }); } }, "older →") : "");
  },
  onTrajectory(row) {
    if (this.params.get("cursor")) return; // only the first page follows the live stream
    (this.fresh ||= new Set()).add(row.id);
    this.reload();
  },
  reload: debounce(() => { if (S.page === ListPage) { ListPage.load(ListPage.fresh); ListPage.fresh = new Set(); } }, 300),
};

const GroupsPage = {
  async render(params) {
    const step = params.get("step") ?? (S.run.last_step ?? "");
    const steps = [];
    for (let s = S.run.first_step ?? 0; s <= (S.run.last_step ?? -1); s++) steps.push(s);
    const picker = h("select", { onchange: (e) => setHash("/groups", { step: e.target.value }) },
      steps.map((s) => h("option", { value: s, selected: String(s) === String(step) }, `step ${s}`)));
    const root = h("div", {}, h("div", { class: "filters" }, "Groups of ", picker));
    if (step === "") return root;
    const { tasks } = await api(`api/groups?step=${step}`);
    root.append(h("table", { class: "grid" }, h("tr", {}, ["task", "graded", "mean reward", "resolved", "reward var"].map((c) => h("th", {}, c))),
      Object.entries(tasks).map(([task, t]) => h("tr", {},
        h("td", {}, h("a", { href: `#/group?step=${step}&task=${encodeURIComponent(task)}` }, task)), h("td", { class: "num" }, t.n),
        h("td", { class: "num" }, fmt(t.mean_reward)), h("td", { class: "num" }, fmt(t.resolved_rate)),
        h("td", { class: "num" }, t.reward_var === 0 ? h("span", { class: "badge sev-warning", title: "no learning signal" }, "0") : fmt(t.reward_var))))));
    return root;
  },
};

const GroupPage = {
  async render(params) {
    const step = params.get("step"), task = params.get("task");
    const g = await api(`api/group?step=${encodeURIComponent(step)}&task=${encodeURIComponent(task)}`);
    const graded = g.trajectories.filter((t) => t.status && !t.masked).map((t) => t.reward);
    const mean = graded.length ? graded.reduce((a, b) => a + b, 0) / graded.length : null;
    const zeroVar = Number(step) >= 0 && graded.length > 0 && graded.every((r) => r === graded[0]);
    return h("div", {}, h("h2", {}, `Group: ${task} · ${stepLabel(Number(step), true)}`),
      h("p", { class: "muted" }, `${g.trajectories.length} trajectories · mean reward ${fmt(mean)} (masked ones excluded)`),
      h("div", { class: "group" }, g.trajectories.map((t) => h("a", { class: "gcard", href: `#/t/${encodeURIComponent(t.session_id)}` },
        h("div", { class: "mono" }, t.session_id), h("div", {}, t.harness || ""), statusBadge(t.status, t.masked),
        h("div", { class: "big" }, `reward ${fmt(t.reward)}`), h("div", {}, t.advantage === null && t.status && !t.masked && zeroVar
          ? "advantage — (group skipped: zero variance, not trained)" : `advantage ${fmt(t.advantage)}`),
        h("div", {}, `${t.n_turns} turns · ${t.completion_tokens} tokens`),
        h("div", {}, `tests ${t.tests_passed}/${t.tests_total}`), h("div", {}, flagBadges(t.flags))))));
  },
};

const ComparePage = {
  async render(params) {
    const p = Object.fromEntries(["a_step", "b_step", "b_run"].map((k) => [k, params.get(k) || ""]));
    if (!params.has("a_step") && S.run.last_step !== null) { p.a_step = S.run.first_step; p.b_step = S.run.last_step; }
    const stepInput = (name) => h("input", { name, type: "number", size: 5, value: p[name], placeholder: "all" });
    const form = h("form", { class: "filters", onsubmit: (e) => {
      e.preventDefault();
      setHash("/compare", Object.fromEntries(["a_step", "b_step", "b_run"].map((k) => [k, form.elements[k].value])));
    } }, "A: this run, step ", stepInput("a_step"), " vs B: run ",
      h("select", { name: "b_run" }, S.run.runs.map((r) => h("option", { value: r === S.run.run_dir ? "" : r, selected: (p.b_run || S.run.run_dir) === r }, r))),
      " step ", stepInput("b_step"), h("button", { type: "submit" }, "Compare"));
    const root = h("div", {}, form);
    const q = new URLSearchParams(Object.entries(p).filter(([, v]) => v !== ""));
    let c;
    try { c = await api(`api/compare?${q}`); } catch (e) { root.append(h("p", { class: "error" }, e.message)); return root; }
    root.append(h("p", {}, h("span", { class: "badge v-improved" }, `${c.counts.improved} improved`), " ",
      h("span", { class: "badge v-regressed" }, `${c.counts.regressed} regressed`), " ",
      h("span", { class: "badge" }, `${c.counts.same} same`), ` · ${c.only_a.length} tasks only in A, ${c.only_b.length} only in B`),
    h("table", { class: "grid compare" }, h("tr", {}, ["task", "A mean reward", "A n", "B mean reward", "B n", "Δ", ""].map((x) => h("th", {}, x))),
      c.tasks.map((t) => h("tr", { class: `v-${t.verdict}` }, h("td", {}, t.instance_id),
        h("td", { class: "num" }, fmt(t.a.mean_reward)), h("td", { class: "num" }, t.a.n),
        h("td", { class: "num" }, fmt(t.b.mean_reward)), h("td", { class: "num" }, t.b.n),
        h("td", { class: "num" }, (t.delta > 0 ? "+" : "") + fmt(t.delta)), h("td", {}, h("span", { class: `badge v-${t.verdict}` }, t.verdict))))));
    return root;
  },
};
