// Line charts in plain SVG: metric series over training steps, with a hover read-out and
// optional reference lines (monitor thresholds) and alert markers.
"use strict";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d",
  "#9333ea", "#ea580c", "#0d9488", "#4b5563"];

function niceTicks(lo, hi, n = 4) {
  if (lo === hi) { lo -= 0.5; hi += 0.5; }
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
  return ticks;
}

// series: [{name, points: [[step, value|null], ...]}]; opts: {refs: [{y, label}], marks: [step...]}
function lineChart(title, series, opts = {}) {
  const W = 340, H = 170, L = 44, R = 10, T = 10, B = 22;
  const pts = series.flatMap((s) => s.points.filter((p) => p[1] !== null));
  const box = h("div", { class: "chart", "data-title": title });
  box.append(h("div", { class: "chart-title", title: opts.doc || "" }, title));
  if (!pts.length) { box.append(h("div", { class: "chart-empty" }, "no data yet")); return box; }
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  const ys = pts.map((p) => p[1]).concat((opts.refs || []).map((r) => r.y));
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (opts.zero !== false && y0 > 0 && y0 < (y1 - y0) * 2) y0 = 0;
  const pad = (y1 - y0) * 0.08 || Math.abs(y1) * 0.1 || 0.5;
  y0 -= pad; y1 += pad;
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart-svg" });
  for (const t of niceTicks(y0, y1)) {
    root.append(svg("line", { x1: L, x2: W - R, y1: Y(t), y2: Y(t), class: "grid" }));
    root.append(svg("text", { x: L - 4, y: Y(t) + 3, class: "tick", "text-anchor": "end" }, String(+t.toPrecision(3))));
  }
  for (const t of niceTicks(x0, x1, 5).filter((t) => Number.isInteger(t)))
    root.append(svg("text", { x: X(t), y: H - 6, class: "tick", "text-anchor": "middle" }, t));
  for (const m of opts.marks || [])
    root.append(svg("line", { x1: X(m.step), x2: X(m.step), y1: T, y2: H - B, class: `mark sev-${m.severity}` },
      svg("title", {}, m.text)));
  for (const r of opts.refs || [])
    root.append(svg("line", { x1: L, x2: W - R, y1: Y(r.y), y2: Y(r.y), class: "ref" }, svg("title", {}, r.label)));
  series.forEach((s, i) => {
    const color = s.color || PALETTE[i % PALETTE.length];
    let d = "", pen = false;
    for (const [x, y] of s.points) {
      if (y === null) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${X(x).toFixed(1)},${Y(y).toFixed(1)}`;
      pen = true;
    }
    root.append(svg("path", { d, class: "line", stroke: color }));
    if (s.points.length <= 60)
      for (const [x, y] of s.points) if (y !== null) root.append(svg("circle", { cx: X(x), cy: Y(y), r: 2, fill: color }));
  });
  const cursor = svg("line", { y1: T, y2: H - B, class: "cursor", visibility: "hidden" });
  root.append(cursor);
  const readout = h("div", { class: "readout" });
  root.addEventListener("mousemove", (ev) => {
    const rect = root.getBoundingClientRect();
    const x = x0 + ((ev.clientX - rect.left) / rect.width * W - L) / (W - L - R) * (x1 - x0);
    const steps = [...new Set(pts.map((p) => p[0]))];
    const step = steps.reduce((a, b) => (Math.abs(b - x) < Math.abs(a - x) ? b : a), steps[0]);
    cursor.setAttribute("x1", X(step)); cursor.setAttribute("x2", X(step)); cursor.setAttribute("visibility", "visible");
    readout.textContent = `step ${step}: ` + series.map((s) => {
      const p = s.points.find((q) => q[0] === step);
      return `${s.name} ${p ? fmt(p[1]) : "—"}`;
    }).join(" · ");
  });
  root.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); readout.textContent = ""; });
  box.append(root);
  if (series.length > 1 || opts.legend)
    box.append(h("div", { class: "legend" }, series.map((s, i) =>
      h("span", {}, h("i", { style: { background: s.color || PALETTE[i % PALETTE.length] } }), s.name))));
  box.append(readout);
  return box;
}
