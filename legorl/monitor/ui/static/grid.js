// The solve grid: tasks × steps, each cell one group, its colour the group's resolved share
// (red 0 → green 1, grey: no graded rollout), a click opens the group. The run's headline
// panel: which tasks the policy learns to solve, and when. Redrawn when trajectories arrive.
"use strict";

function solveColour(r) {
  return `hsl(${Math.round(120 * r)}, 65%, ${Math.round(88 - 30 * r)}%)`;
}

const GridPage = {
  async render() {
    const root = h("div", { id: "grid" });
    await GridPage.fill(root);
    return root;
  },
  async fill(root) {
    const g = await api("api/solve_grid");
    const names = Object.keys(g.tasks);
    if (!names.length) { root.replaceChildren(h("p", { class: "muted" }, "No graded group yet.")); return; }
    const solved = (t) => Object.values(g.tasks[t]).reduce((a, c) => a + c.resolved_rate * c.n, 0);
    names.sort((a, b) => solved(b) - solved(a) || a.localeCompare(b));
    const head = h("tr", {}, h("th", {}, "task"), g.steps.map((s) => h("th", { class: "num" }, s)));
    const rows = names.map((task) => h("tr", { "data-task": task }, h("td", { class: "task" }, task),
      g.steps.map((s) => {
        const c = g.tasks[task][s];
        if (!c) return h("td", { class: "cell empty" });
        const share = `${Math.round(100 * c.resolved_rate)}% of ${c.n} resolved`;
        return h("td", { class: "cell", "data-step": s, "data-resolved": c.resolved_rate, title: `step ${s}: ${share}`,
          style: `background:${solveColour(c.resolved_rate)}` },
          h("a", { href: `#/group?step=${s}&task=${encodeURIComponent(task)}`, "aria-label": `${task} step ${s}: ${share}` }, " "));
      })));
    root.replaceChildren(h("p", { class: "muted" }, "Each cell is one group: its colour is the share of its graded rollouts that resolved the task (red 0, green 1). Click a cell for the group."),
      h("table", { class: "solve-grid" }, head, rows));
  },
  refresh: debounce(() => {
    const root = document.getElementById("grid");
    if (root && S.page === GridPage) GridPage.fill(root);
  }, 1000),
  onTrajectory() { GridPage.refresh(); },
};
