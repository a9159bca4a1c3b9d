// App state, hash router and the live stream. The stream is opened before the first
// snapshot is fetched, so any change between the two arrives as an event (handlers are
// idempotent: metrics overwrite by (key, step), alerts dedupe by id).
"use strict";

const S = { run: null, metrics: {}, alerts: [], alertIds: new Set(), page: null };

function mergeMetrics(series) {
  for (const [key, points] of Object.entries(series)) {
    const byStep = new Map((S.metrics[key] || []).map((p) => [p[0], p[1]]));
    for (const [step, v] of points) byStep.set(step, v);
    S.metrics[key] = [...byStep.entries()].sort((a, b) => a[0] - b[0]);
  }
}

function addAlert(a) {
  if (S.alertIds.has(a.id)) return false;
  S.alertIds.add(a.id);
  S.alerts.push(a);
  return true;
}

function call(hook, ...args) {
  if (S.page && typeof S.page[hook] === "function") S.page[hook](...args);
}

const refreshRun = debounce(async () => {
  S.run = { ...S.run, ...(await api("api/run")) };
  document.getElementById("run-name").textContent = S.run.name;
  call("onRun");
}, 500);

function connect() {
  const live = document.getElementById("live");
  return new Promise((resolve) => {
    const es = new EventSource("api/stream");
    es.addEventListener("hello", () => { live.textContent = "● live"; live.className = "live on"; resolve(); });
    es.addEventListener("trajectory", (e) => { const row = JSON.parse(e.data); refreshRun(); call("onTrajectory", row); });
    es.addEventListener("metrics", (e) => { mergeMetrics(JSON.parse(e.data).series); call("onMetrics"); });
    es.addEventListener("alert", (e) => { if (addAlert(JSON.parse(e.data))) call("onAlert"); });
    es.addEventListener("event", (e) => call("onEvent", JSON.parse(e.data)));
    es.onerror = () => { live.textContent = "● reconnecting"; live.className = "live off"; resolve(); };
    setTimeout(resolve, 3000); // never block the first render on the stream
  });
}

async function route() {
  const { path, params } = hashParams();
  let page = OverviewPage, arg = null, name = "overview";
  if (path.startsWith("/t/")) { page = TrajectoryPage; arg = decodeURIComponent(path.slice(3)); name = "trajectories"; }
  else if (path === "/trajectories") { page = ListPage; name = "trajectories"; }
  else if (path === "/groups") { page = GroupsPage; name = "groups"; }
  else if (path === "/group") { page = GroupPage; name = "groups"; }
  else if (path === "/compare") { page = ComparePage; name = "compare"; }
  else if (path === "/status") { page = StatusPage; name = "status"; }
  else if (path === "/grid") { page = GridPage; name = "grid"; }
  else if (path === "/outcomes") { page = OutcomesPage; name = "outcomes"; }
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === name));
  S.page = page;
  const main = document.getElementById("main");
  try {
    const el = await page.render(params, arg);
    if (S.page === page) main.replaceChildren(el);
  } catch (e) {
    main.replaceChildren(h("p", { class: "error" }, `Could not load this page: ${e.message}`));
  }
  document.body.dataset.page = name;
}

async function start() {
  await connect();
  const [run, metrics, alerts] = await Promise.all([api("api/run"), api("api/metrics"), api("api/alerts")]);
  S.run = run;
  document.getElementById("run-name").textContent = run.name;
  mergeMetrics(metrics.series);
  alerts.forEach(addAlert);
  window.addEventListener("hashchange", route);
  await route();
  document.body.dataset.ready = "1";
}

start();
