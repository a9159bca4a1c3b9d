// One trajectory: outcome (failure class, tests, flags, diff), then every turn with the
// messages the harness sent since the previous turn, the sampled tokens coloured by
// log-prob, and segment boundaries.
"use strict";

function diffView(diff) {
  if (!diff) return h("p", { class: "muted" }, "(no diff)");
  return h("pre", { class: "diff" }, diff.split("\n").map((line) => {
    const cls = line.startsWith("+++") || line.startsWith("---") ? "meta" : line.startsWith("+") ? "add"
      : line.startsWith("-") ? "del" : line.startsWith("@@") ? "hunk" : "";
    return h("span", { class: `dl ${cls}` }, line + "\n");
  }));
}

function messageView(m) {
  const long = (m.text || "").length > 2000;
  const body = h("pre", { class: `msg-text${long ? " clipped" : ""}` }, m.text || "");
  const head = h("div", { class: "msg-head" }, h("span", { class: `role r-${m.role}` }, m.role),
    m.kind !== "text" ? h("span", { class: `kind k-${m.kind}` }, m.kind.replace("_", " ")) : "",
    m.name ? h("span", { class: "mono" }, m.name) : "", m.call_id ? h("span", { class: "muted mono" }, m.call_id) : "",
    m.is_error ? h("span", { class: "badge sev-critical" }, "error") : "",
    long ? h("a", { href: "#", onclick: (e) => { e.preventDefault(); body.classList.toggle("clipped"); } }, "expand") : "");
  return h("div", { class: `msg m-${m.kind}` }, head, body);
}

function testsView(tests) {
  const entries = Object.entries(tests || {});
  if (!entries.length) return h("p", { class: "muted" }, "(no test results)");
  return h("table", { class: "grid tests" }, entries.map(([name, res]) =>
    h("tr", {}, h("td", { class: "mono" }, name), h("td", {}, h("span", { class: `badge t-${res}` }, res)))));
}

const TrajectoryPage = {
  mode: "rollout",
  async render(params, sid) {
    this.sid = sid;
    this.root = h("div", { class: "trajectory" });
    await this.load();
    return this.root;
  },
  async load() {
    let t;
    try { t = await api(`api/trajectories/${encodeURIComponent(this.sid)}`); }
    catch (e) { this.root.replaceChildren(h("p", { class: "error" }, e.message)); return; }
    this.t = t;
    this.draw();
  },
  draw() {
    const t = this.t, o = t.outcome;
    const groupLink = t.step !== null && t.step >= 0 && t.instance_id
      ? h("a", { href: `#/group?step=${t.step}&task=${encodeURIComponent(t.instance_id)}` }, "group view") : "";
    const header = h("div", { class: "thead" },
      h("h2", {}, h("span", { class: "mono" }, t.session_id), " ", statusBadge(t.status, t.masked), " ", flagBadges(t.flags)),
      h("div", { class: "kv" }, kv("task", t.instance_id), kv("harness", t.harness), kv(t.phase ? "phase" : "step", stepLabel(t.step)),
        kv("reward", fmt(t.reward)), kv("advantage", t.advantage === null && t.untrained ? "none" : fmt(t.advantage)), kv("turns", t.n_turns),
        kv("segments", t.n_segments), kv("sampled tokens", t.completion_tokens), groupLink),
      t.untrained ? h("p", { class: "untrained" }, h("span", { class: "badge sev-info" }, "no advantage"), " ", t.untrained) : "");
    const outcome = o ? h("section", { class: "outcome" },
      h("div", { class: "cols" },
        h("div", {}, h("h3", {}, "Outcome"), h("div", { class: "kv" }, kv("failure class", o.status), kv("reward", fmt(o.reward)),
          kv("masked", o.masked ? "yes (infra: excluded from loss and group stats)" : "no"), kv("flags", o.flags.join(", ") || "none")),
          h("h3", {}, "Tests"), testsView(o.tests),
          Object.keys(o.evidence).length ? h("details", {}, h("summary", {}, "evidence"), h("pre", {}, JSON.stringify(o.evidence, null, 2))) : ""),
        h("div", { class: "diff-col" }, h("h3", {}, "Final diff"), diffView(o.diff))))
      : h("section", { class: "outcome muted" }, "Not graded yet.");
    const modes = h("div", { class: "modes" }, "colour tokens by: ", TOKEN_MODES.map(([m, label]) =>
      h("button", { class: m === this.mode ? "on" : "", "data-mode": m, onclick: () => { this.mode = m; this.draw(); } }, label)),
      " ", tokenLegend(this.mode));
    const turns = [];
    let prevSeg = null;
    for (const turn of t.turns) {
      if (turn.segment !== prevSeg && turn.segment !== null) {
        const seg = t.segments.find((s) => s.idx === turn.segment);
        turns.push(h("div", { class: "segment-start", "data-segment": turn.segment },
          `segment ${turn.segment}`, seg ? ` · turns ${seg.turn_indices.join(", ")} · ${seg.n_tokens} tokens, ${seg.n_sampled} trained` : "",
          prevSeg !== null ? " — the prompt no longer extends the previous turn (compaction or re-serialisation)" : ""));
      }
      prevSeg = turn.segment ?? prevSeg;
      turns.push(this.turnView(turn));
    }
    const y = window.scrollY;
    this.root.replaceChildren(header, outcome, h("h3", {}, "Turns"), modes, ...turns);
    window.scrollTo(0, y);
  },
  turnView(turn) {
    const tags = [turn.side_call ? h("span", { class: "badge" }, turn.segment == null ? "side call (not trained)" : "side call (trained)") : "",
      turn.format_error ? h("span", { class: "badge sev-critical" }, "format error") : "",
      turn.trainer_logprobs || turn.side_call ? "" : this.t.untrained
        ? h("span", { class: "badge muted", title: this.t.untrained }, "not trained: no trainer logprobs")
        : h("span", { class: "badge muted" }, "no trainer logprobs yet")];
    const req = h("div", { class: "req" });
    const showReq = h("a", { href: "#", onclick: async (e) => {
      e.preventDefault();
      const r = await api(`api/trajectories/${encodeURIComponent(this.sid)}/turns/${turn.index}/request`);
      req.replaceChildren(h("pre", { class: "raw" }, JSON.stringify(r, null, 2)));
    } }, "raw request");
    return h("section", { class: "turn", "data-turn": turn.index },
      h("div", { class: "turn-head" }, h("b", {}, `turn ${turn.index}`), ` · ${turn.dialect} · policy v${turn.policy_version}`,
        ` · finish ${turn.finish_reason} · prompt ${turn.n_prompt} tokens (${turn.reused_prompt_tokens} reused) · `,
        `${turn.n_completion} sampled`, ...tags, " · ", showReq),
      turn.index === 0 && turn.tools.length ? h("div", { class: "muted earlier" }, `tools offered: ${turn.tools.join(", ")}`) : "",
      turn.earlier_messages ? h("div", { class: "muted earlier" }, `… ${turn.earlier_messages} earlier messages (shown in previous turns)`) : "",
      turn.messages.map(messageView), req,
      h("div", { class: "completion" }, h("div", { class: "msg-head" }, h("span", { class: "role r-assistant" }, "sampled"),
        turn.pieces ? "" : h("span", { class: "muted" }, "token ids (no decoded pieces stored)")), tokenView(turn, this.mode)),
      turn.completion.filter((m) => m.kind === "tool_call").map(messageView));
  },
  onTrajectory(row) {
    if (row.session_id === this.sid && (!this.t || row.rev !== this.t.rev)) this.reload();
  },
  reload: debounce(() => { if (S.page === TrajectoryPage) TrajectoryPage.load(); }, 300),
};

function kv(k, v) {
  return h("span", { class: "kvp" }, h("span", { class: "k" }, k), h("span", { class: "v" }, v ?? "—"));
}
