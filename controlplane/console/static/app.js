// The read-only console (DESIGN M2): sign in with a token kept in this tab's session storage,
// then pools with their capacity ledger (H6, D7), nodes by state with GPU health, cordon/drain
// reasons and the bookings on them (H3, H5, H7, D4), the tenant's live reservations with what
// each holds and how far its host has got delivering it (D4), the bookings on the tenant's
// nodes whoever's they are, and the event log followed by long-poll (B2). Every panel is drawn
// again when new events arrive. The DOM is built with createElement and
// textContent only: nothing the API answers is ever parsed as HTML.

import { call, listAll } from "./api.js";

const SESSION_KEY = "better-compute.console";
const WAIT_SECONDS = 25; // B2: each events/list call waits up to this long for a new event
const RETRY_MS = 2000;
const PAGE = 1000; // B1: items a list call answers at most
const MAX_EVENTS = 500; // the log keeps the newest ones
const LIVE_STATES = ["pending", "placed", "active"];
const NODE_STATES = ["ready", "configuring", "quarantined", "lost"];
const SVG = "http://www.w3.org/2000/svg";

const byId = (id) => document.getElementById(id);

// --- building the DOM ------------------------------------------------------------------------

function present(children) {
  return children
    .flat(Infinity)
    .filter((child) => child !== null && child !== undefined && child !== false);
}

function h(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined) continue;
    if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, String(value));
  }
  node.append(...present(children));
  return node;
}

function svg(tag, attributes, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
  node.append(...present(children));
  return node;
}

// An id shortened for the eye (`pool_…x7k2mq`), whole in its tooltip.
function idCode(id) {
  if (!id) return h("span", { class: "none" }, "—");
  const cut = id.indexOf("_");
  const body = id.slice(cut + 1);
  const shown = body.length > 10 ? `${id.slice(0, cut + 1)}…${body.slice(-6)}` : id;
  return h("code", { class: "id", title: id }, shown);
}

function when(at) {
  return at ? at.slice(0, 19).replace("T", " ") : "—";
}

function empty(text) {
  return h("p", { class: "empty" }, text);
}

// --- the session -------------------------------------------------------------------------------

let active = null; // the signed-in run: { session, controller, refreshing, again }

function savedSession() {
  try {
    const saved = JSON.parse(sessionStorage.getItem(SESSION_KEY) || "null");
    return saved && typeof saved.token === "string" && typeof saved.tenant === "string"
      ? saved
      : null;
  } catch {
    return null;
  }
}

function showSignIn(message) {
  for (const id of ["console", "who", "live", "sign-out"]) byId(id).hidden = true;
  byId("sign-in").hidden = false;
  byId("sign-in-error").textContent = message;
  byId("token").value = "";
  byId("token").focus();
}

function signOut(message) {
  sessionStorage.removeItem(SESSION_KEY);
  if (active) active.controller.abort();
  active = null;
  showSignIn(message);
}

function refusal(error, tenant) {
  if (error.status === 401) return "Unknown, revoked or expired token.";
  if (error.status === 403) return `This token may not act for tenant ${tenant}.`;
  return `${error.code}: ${error.message}`;
}

// The tenant is the token's own (iam/credentials/whoami), or the one named to act for (root's
// tokens may act for any tenant); a pools/list for it shows the token may.
async function signIn(event) {
  event.preventDefault(); // nothing is submitted anywhere (form-action 'none')
  const token = byId("token").value.trim();
  const named = byId("tenant").value.trim();
  const button = event.target.querySelector("button[type=submit]");
  button.disabled = true;
  let session;
  try {
    const caller = await call(token, "iam/credentials/whoami", {});
    session = { token, tenant: named || caller.tenantId, credential: caller.credentialId };
    await call(token, "compute/pools/list", { tenantId: session.tenant });
  } catch (error) {
    byId("sign-in-error").textContent = refusal(error, named);
    return;
  } finally {
    button.disabled = false;
  }
  sessionStorage.setItem(SESSION_KEY, JSON.stringify(session));
  start(session);
}

function start(session) {
  active = { session, controller: new AbortController(), refreshing: null, again: false };
  byId("sign-in").hidden = true;
  byId("console").hidden = false;
  byId("who").textContent = `tenant ${session.tenant}`;
  byId("who").title = `credential ${session.credential}`;
  for (const id of ["who", "live", "sign-out"]) byId(id).hidden = false;
  // Nothing of a session before stays on show while this one's first answers come.
  for (const id of ["pools", "nodes", "reservations", "bookings", "events"]) {
    byId(id).replaceChildren();
  }
  for (const id of ["pools", "nodes", "reservations", "bookings"]) {
    byId(`${id}-count`).textContent = "";
  }
  byId("bookings-panel").hidden = true;
  setLive("waiting", "connecting…");
  refreshSoon(active);
  follow(active);
}

// A refused or failed call: a dead token signs out; anything else is shown, and the caller
// tries again after RETRY_MS.
function failed(run, error, show) {
  if (error.name === "AbortError" || run !== active) return;
  if (error.status === 401) signOut("The token is no longer valid: sign in again.");
  else show(`${error.code}: ${error.message}`);
}

// --- pools, nodes and reservations -----------------------------------------------------------

// The API's refusal of what the token may not read (R1): 403, or 404 for what it may not see.
const refused = (error) => error.status === 403 || error.status === 404;

// One refresh at a time; asks made meanwhile fold into one more after it.
function refreshSoon(run) {
  if (run.refreshing) {
    run.again = true;
    return;
  }
  run.refreshing = refresh(run).finally(() => {
    run.refreshing = null;
    if (run.again && run === active) {
      run.again = false;
      refreshSoon(run);
    }
  });
}

// The pools with their ledgers, the fleet's nodes and the live reservations, each on its own:
// a panel the token may not read (a refusal, 403 or 404) says so and the others are drawn.
// reservations/list answers the signed-in tenant's own reservations only; what other tenants
// book on this tenant's nodes only the nodes' bookings tell (D4: the owner's view), so those
// are drawn from the nodes, in a panel of their own shown to a tenant that has nodes.
async function refresh(run) {
  const { token, tenant } = run.session;
  const signal = run.controller.signal;
  const results = await Promise.allSettled([
    poolsWithLedgers(token, tenant, signal),
    // H7: without poolId, the fleet view: every node of every pool the tenant owns.
    listAll(token, "compute/nodes/list", { tenantId: tenant, limit: PAGE }, signal),
    listAll(
      token,
      "compute/reservations/list",
      { tenantId: tenant, states: LIVE_STATES, limit: PAGE },
      signal,
    ),
  ]);
  if (run !== active) return;
  const [pools, nodes, reservations] = results.map((result) => result.value);
  const panels = [
    ["pools", () => renderPools(...pools)],
    ["nodes", () => renderNodes(nodes)],
    ["reservations", () => renderReservations(reservations)],
  ];
  let retry = null;
  results.forEach((result, i) => {
    const [name, render] = panels[i];
    if (result.status === "fulfilled") render();
    else if (refused(result.reason)) {
      byId(`${name}-count`).textContent = "";
      byId(name).replaceChildren(empty(`This token may not read ${name}.`));
    } else retry = retry ?? result.reason;
  });
  const owner = results[1].status === "fulfilled" && nodes.length > 0;
  byId("bookings-panel").hidden = !owner;
  if (owner) renderBookings(nodes);
  if (retry === null) showProblem(null);
  else {
    failed(run, retry, (text) => {
      showProblem(text);
      setTimeout(() => run === active && refreshSoon(run), RETRY_MS);
    });
  }
}

// Each pool's ledger rows, or null where the token may not read that pool's capacity.
async function poolsWithLedgers(token, tenant, signal) {
  const pools = await listAll(token, "compute/pools/list", { tenantId: tenant }, signal);
  const ledgers = await Promise.all(
    pools.map((pool) =>
      call(token, "compute/pools/capacity", { tenantId: tenant, poolId: pool.id }, signal).then(
        (ledger) => ledger.items,
        (error) => (refused(error) ? null : Promise.reject(error)),
      ),
    ),
  );
  return [pools, ledgers];
}

function showProblem(text) {
  byId("problem").hidden = text === null;
  byId("problem").textContent = text ?? "";
}

function renderPools(pools, ledgers) {
  byId("pools-count").textContent = `(${pools.length})`;
  const cards = pools.map((pool, i) => poolCard(pool, ledgers[i]));
  byId("pools").replaceChildren(
    ...(cards.length ? cards : [empty("No pools visible to this tenant.")]),
  );
}

function poolCard(pool, rows) {
  const badges = [
    pool.owned ? "owned" : `offered by ${pool.ownerTenantId}`,
    pool.archived ? "archived" : null,
  ];
  return h(
    "article",
    { class: pool.archived ? "card pool archived" : "card pool", dataset: { poolId: pool.id } },
    h(
      "header",
      {},
      h("h3", {}, `${pool.gpuModel ?? "CPU"} · ${pool.sharing} · ${pool.class}`),
      present(badges).map((badge) => h("span", { class: "badge" }, badge)),
    ),
    h(
      "p",
      { class: "meta" },
      idCode(pool.id),
      " on site ",
      idCode(pool.siteId),
      ` · version ${pool.version}`,
    ),
    rows === null
      ? empty("This token may not read this pool's capacity.")
      : rows.length
        ? h("table", { class: "ledger" }, h("tbody", {}, rows.map(ledgerRow)))
        : empty("No capacity yet: no node has joined."),
    pool.owned && !pool.archived ? planBox(pool) : null,
  );
}

// C1, C2: a policy pasted into an owned pool's card is planned by pools/update with dryRun
// (nothing changes) and the plan drawn under it. Read-only: applying stays the CLI's or the
// API's. What was pasted and planned outlives the card being drawn again on an event.
const drafts = new Map(); // pool id → { text, answer, problem, open }

function planBox(pool) {
  const draft = drafts.get(pool.id) ?? { text: "", answer: null, problem: null, open: false };
  drafts.set(pool.id, draft);
  const area = h("textarea", {
    class: "plan-policy",
    rows: 5,
    spellcheck: "false",
    placeholder: '{"hostReserve": {"vcpu": 16, "memoryGiB": 64}}',
    "aria-label": "the whole new policy, as JSON",
  });
  area.value = draft.text;
  area.addEventListener("input", () => {
    draft.text = area.value;
  });
  const button = h("button", { type: "button", class: "plan-button" }, "Plan");
  button.addEventListener("click", () => planPolicy(pool.id, draft));
  const box = h(
    "details",
    { class: "plan" },
    h("summary", {}, "plan a policy change"),
    h("p", { class: "note" }, "Paste the whole new policy; nothing is changed."),
    area,
    button,
    h("div", { class: "plan-result" }, planResult(draft)),
  );
  box.open = draft.open;
  box.addEventListener("toggle", () => {
    draft.open = box.open;
  });
  return box;
}

function planResult(draft) {
  if (draft.problem) return h("p", { class: "plan-problem" }, draft.problem);
  return draft.answer ? planView(draft.answer) : null;
}

async function planPolicy(poolId, draft) {
  const run = active;
  const shown = () => {
    const result = document.querySelector(`[data-pool-id="${poolId}"] .plan-result`);
    if (result) result.replaceChildren(...present([planResult(draft)]));
  };
  let policy;
  try {
    policy = JSON.parse(draft.text);
  } catch {
    draft.problem = "The policy is not JSON.";
    draft.answer = null;
    shown();
    return;
  }
  const body = { tenantId: run.session.tenant, poolId, policy, dryRun: true };
  try {
    draft.answer = await call(run.session.token, "compute/pools/update", body, run.controller.signal);
    draft.problem = null;
  } catch (error) {
    if (error.name === "AbortError" || run !== active) return;
    if (error.status === 401) {
      signOut("The token is no longer valid: sign in again.");
      return;
    }
    draft.problem = `${error.code}: ${error.message}`;
    draft.answer = null;
  }
  shown();
}

// The plan: each node's units and what they need, capacity before → after, the offered
// quotas the capacity after would not cover, and the version to apply it at (R3).
function planView({ pool, plan }) {
  const uncovered = plan.quotas.filter((quota) => !quota.covered);
  return h(
    "div",
    { class: "plan-view" },
    plan.warnings.map((warning) => h("p", { class: "plan-warning" }, warning)),
    grid(
      ["node", "units", "needs", "bookings in the way"],
      plan.nodes.map((node) =>
        h(
          "tr",
          { class: "plan-node", dataset: { nodeId: node.nodeId } },
          h("td", {}, node.hostname),
          h(
            "td",
            { class: "units" },
            node.units.length
              ? node.units.map((unit) =>
                  h(
                    "div",
                    { class: `unit ${unit.change}` },
                    `${unit.change} ${unit.id}${unit.needs.length ? ` (${unit.needs.join(", ")})` : ""}`,
                  ),
                )
              : h("span", { class: "none" }, "no change"),
          ),
          h(
            "td",
            { class: "needs" },
            [node.drainNeeded ? "drain" : null, node.rebootNeeded ? "reboot" : null]
              .filter(Boolean)
              .join(", ") || "—",
          ),
          h("td", {}, node.bookingsInTheWay.length ? node.bookingsInTheWay.map(idCode) : "—"),
        ),
      ),
    ),
    grid(
      ["resource", "schedulable before", "after"],
      plan.capacity.map((row) =>
        h(
          "tr",
          {
            class: row.after < row.before ? "plan-capacity less" : "plan-capacity",
            dataset: { resource: row.resource },
          },
          h("td", {}, row.resource),
          h("td", { class: "before" }, String(row.before)),
          h("td", { class: "after" }, String(row.after)),
        ),
      ),
    ),
    uncovered.length
      ? uncovered.map((quota) =>
          h(
            "p",
            { class: "uncovered", dataset: { tenantId: quota.tenantId } },
            `${quota.tenantId}'s ${quota.resource} quota of ${quota.max} would not be covered: ` +
              `${quota.schedulableAfter} schedulable after`,
          ),
        )
      : h("p", { class: "note" }, "Every offered quota stays covered."),
    h("p", { class: "note apply" }, `Apply it at version ${pool.version}.`),
  );
}

// H6: one resource's ledger as a bar: allocated, then available, then what is not schedulable
// (unready or cordoned nodes, unhealthy GPUs), on a scale of the total (or of what was offered,
// when more was sold than exists); the offered sum, when there is one, is a mark across the bar.
// D7: what ended bookings hold until their host releases it is within allocated, drawn over
// the allocated segment's end.
function ledgerRow(row) {
  const scale = Math.max(row.total, row.offered ?? 0, 1);
  const share = (amount) => (100 * amount) / scale;
  const unschedulable = Math.max(row.total - row.allocated - row.available, 0);
  let x = 0;
  const segment = (kind, amount) => {
    const rect = svg("rect", { class: kind, x: share(x), y: 0, width: share(amount), height: 10 });
    x += amount;
    return rect;
  };
  const figures = [
    ["total", row.total],
    ["schedulable", row.schedulable],
    ["allocated", row.allocated],
    ["available", row.available],
    ["releasing", row.releasing],
    ["offered", row.offered],
    // C5: schedulable ÷ offered, the owner's only, when something is offered
    ["coverage", row.coverage === undefined || row.coverage === null ? undefined : row.coverage.toFixed(2)],
  ].filter(([, value]) => value !== undefined);
  const text = figures.map(([name, value]) => `${name} ${value}`).join(" · ");
  const bar = svg(
    "svg",
    {
      class: "ledger-bar",
      viewBox: "0 0 100 10",
      preserveAspectRatio: "none",
      role: "img",
      "aria-label": text,
    },
    svg("title", {}, `${row.resource}: ${text}`),
    segment("allocated", row.allocated),
    row.releasing
      ? svg("rect", {
          class: "releasing",
          x: share(row.allocated - row.releasing),
          y: 0,
          width: share(row.releasing),
          height: 10,
        })
      : null,
    segment("available", row.available),
    segment("unschedulable", unschedulable),
    !row.offered // absent (not the owner) or nothing offered: no mark
      ? null
      : svg("rect", {
          class: "offered",
          x: Math.min(share(row.offered), 99.2),
          y: 0,
          width: 0.8,
          height: 10,
        }),
  );
  return h(
    "tr",
    { dataset: { resource: row.resource } },
    h("th", {}, row.resource),
    h("td", { class: "bar-cell" }, bar),
    h(
      "td",
      { class: "figures" },
      figures.map(([name, value], i) => [
        i ? " · " : null,
        h(
          "span",
          { class: name === "coverage" && row.coverage < 1 ? "figure coverage oversold" : `figure ${name}` },
          `${name} ${value}`,
        ),
      ]),
    ),
  );
}

function renderNodes(nodes) {
  byId("nodes-count").textContent = `(${nodes.length})`;
  const groups = new Map(NODE_STATES.map((state) => [state, []]));
  for (const node of nodes) {
    if (!groups.has(node.state)) groups.set(node.state, []);
    groups.get(node.state).push(node);
  }
  const sections = [...groups]
    .filter(([, members]) => members.length > 0)
    .map(([state, members]) =>
      h(
        "section",
        { class: `state-group state-${state}`, dataset: { state } },
        h("h3", {}, `${state} (${members.length})`),
        nodeTable(members),
      ),
    );
  byId("nodes").replaceChildren(
    ...(sections.length ? sections : [empty("No nodes in the pools this tenant owns.")]),
  );
}

// Each node's row, and below it, when something is booked on it, a row of its bookings (D4)
// across the columns: a column of its own would widen the table past its panel.
function nodeTable(nodes) {
  const columns = ["host", "node", "pool", "schedulable", "GPUs (health)", "why"];
  return grid(columns, nodes.map((node) => [nodeRow(node), bookingsRow(node)]));
}

// H5: `healthy`, or `unhealthy: xid:79` with the agent's reason.
function health(gpu) {
  return gpu.healthReason ? `${gpu.health}: ${gpu.healthReason}` : gpu.health;
}

// H5: one chip per GPU, coloured by health, outlined when a booking holds it (D4); H1, H3: why
// a node is not (fully) schedulable.
function nodeRow(node) {
  const bookings = node.bookings ?? []; // an empty list is left out of the answer
  const holder = new Map(bookings.flatMap((b) => b.gpus.map((uuid) => [uuid, b])));
  const chips = node.gpus.map((gpu) => {
    const booking = holder.get(gpu.uuid);
    return h(
      "span",
      {
        class: booking ? `gpu ${gpu.health} booked` : `gpu ${gpu.health}`,
        title:
          `GPU ${gpu.index} ${gpu.name}: ${health(gpu)}` +
          (booking ? `; booked by ${booking.tenantId} (${booking.reservationId})` : ""),
        dataset: { health: gpu.health },
      },
      String(gpu.index),
    );
  });
  const reasons = [
    node.stateReason ? `${node.state}: ${node.stateReason}` : null,
    node.cordon ? `cordoned: ${node.cordon.reason} (since ${when(node.cordon.at)})` : null,
    node.drain
      ? `drain ${node.drain.state}: ${node.drain.reason}` +
        (node.drain.deadline ? ` (deadline ${when(node.drain.deadline)})` : "")
      : null,
    node.pendingReboot ? "reboot pending" : null,
    ...node.gpus
      .filter((gpu) => gpu.health !== "healthy")
      .map((gpu) => `GPU ${gpu.index} ${health(gpu)}`),
  ];
  return h(
    "tr",
    { class: bookings.length ? "has-bookings" : null, dataset: { nodeId: node.id } },
    h("td", { class: "host" }, node.hostname),
    h("td", {}, idCode(node.id)),
    h("td", {}, idCode(node.poolId)),
    h("td", { class: node.schedulable ? "yes" : "no" }, node.schedulable ? "yes" : "no"),
    h("td", { class: "gpus" }, chips.length ? chips : h("span", { class: "none" }, "none")),
    h(
      "td",
      { class: "reasons" },
      present(reasons).map((reason) => h("div", { class: "reason" }, reason)),
    ),
  );
}

// D4: the node's live and releasing bookings, whoever's they are (the owner's view): the
// reservation, its tenant, the devices and CPUs it holds, and its delivery.
function bookingsRow(node) {
  const bookings = node.bookings ?? [];
  if (!bookings.length) return null;
  return h(
    "tr",
    { class: "bookings-row", dataset: { bookingsOf: node.id } },
    h("td", { class: "bookings-label" }, "booked"),
    h(
      "td",
      { colspan: 5 },
      bookings.map((booking) =>
        h(
          "div",
          { class: "booking", dataset: { reservationId: booking.reservationId } },
          idCode(booking.reservationId),
          " ",
          h("span", { class: "tenant" }, booking.tenantId),
          present([bookedDevices(booking, node), cpusText(booking.cpus, booking.cpuQuota)]).map(
            (part) => ` · ${part}`,
          ),
          " · ",
          h("span", { class: `delivery ${booking.delivery}` }, booking.delivery),
        ),
      ),
    ),
  );
}

// --- what a booking holds (D3, D4) -----------------------------------------------------------

// D3: exclusive CPUs are `pinned`; where vCPUs are overcommitted the booking has a share
// (vcpu × 100 percent) of the CPUs near its GPUs.
function cpusText(cpus, quota) {
  if (!cpus && (quota === null || quota === undefined)) return null;
  return quota === null || quota === undefined
    ? `CPUs ${cpus} pinned`
    : `CPUs ${cpus || "—"} share ${quota}%`;
}

function gib(bytes) {
  return `${Number((bytes / 2 ** 30).toFixed(1))} GiB`;
}

// A node booking names its devices by UUID (and slots as `gpuIndex/slot`): shown by the node's
// GPU indices, MIG instances with their profile from the node's inventory.
function bookedDevices(booking, node) {
  const index = new Map(node.gpus.map((gpu) => [gpu.uuid, gpu.index]));
  const mig = new Map(
    (node.inventory?.gpus ?? []).flatMap((gpu) =>
      (gpu.migInstances ?? []).map((m) => [m.uuid, `MIG ${m.profile} on GPU ${gpu.index}`]),
    ),
  );
  const parts = [
    booking.gpus.length
      ? `GPU ${booking.gpus.map((uuid) => index.get(uuid) ?? uuid).join(", ")}`
      : null,
    ...booking.migInstances.map((uuid) => mig.get(uuid) ?? `MIG ${uuid}`),
    ...booking.slots.map((slot) => {
      const [gpu, number] = slot.split("/");
      return `slot ${number} on GPU ${gpu}`;
    }),
  ];
  return present(parts).join(", ") || null;
}

// D4: a placed reservation's node, each GPU (index, device file, NUMA node, UUID), MIG instance
// and slot, its CPUs, memory and the topology of its GPUs, one line each.
function placementCell(placement) {
  if (!placement) return h("td", { class: "placement" }, h("span", { class: "none" }, "—"));
  const topology = placement.topology;
  const links = present([
    topology.nvlink === null ? null : topology.nvlink ? "NVLink" : "no NVLink",
    topology.worstLevel ? `worst link ${topology.worstLevel}` : null,
    topology.numaNodes.length ? `NUMA ${topology.numaNodes.join(",")}` : null,
  ]);
  const memory =
    placement.memoryBytes === null
      ? null
      : `memory ${gib(placement.memoryBytes)}` +
        (placement.memoryNodes ? ` from NUMA ${placement.memoryNodes}` : "");
  const line = (kind, ...parts) => h("div", { class: kind }, ...parts);
  return h(
    "td",
    { class: "placement" },
    line("host", h("span", { title: placement.nodeId }, placement.hostname)),
    placement.gpus.map((gpu) =>
      line(
        "device",
        present([
          `GPU ${gpu.index}`,
          gpu.minorNumber === null ? null : `/dev/nvidia${gpu.minorNumber}`,
          gpu.numaNode === null ? null : `NUMA ${gpu.numaNode}`,
        ]).join(" · "),
        " ",
        h("code", { class: "uuid" }, gpu.uuid),
      ),
    ),
    placement.migInstances.map((m) =>
      line(
        "device",
        `MIG ${m.profile} on GPU ${m.gpuIndex} `,
        h("code", { class: "uuid" }, m.uuid),
      ),
    ),
    placement.slots.map((s) => line("device", `slot ${s.slot} on GPU ${s.gpuIndex}`)),
    present([cpusText(placement.cpus, placement.cpuQuota), memory]).map((text) =>
      line("resources", text),
    ),
    links.length ? line("topology", links.join(" · ")) : null,
  );
}

// D6, D7: the host's delivery state, its reason (`gpu busy: pid 4242`) and since when.
function deliveryCell(state, reason, at) {
  if (!state) return h("td", { class: "delivery" }, h("span", { class: "none" }, "—"));
  return h(
    "td",
    { class: `delivery ${state}`, title: at ? `since ${when(at)}` : null },
    h("span", { class: "delivery-state" }, state),
    reason ? h("div", { class: "reason" }, reason) : null,
  );
}

function grid(columns, rows) {
  return h(
    "table",
    { class: "grid" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        columns.map((column) => h("th", {}, column)),
      ),
    ),
    h("tbody", {}, rows),
  );
}

function renderReservations(reservations) {
  byId("reservations-count").textContent = `(${reservations.length})`;
  const rows = [...reservations]
    .sort((a, b) => b.createdAt.localeCompare(a.createdAt))
    .map((r) =>
      h(
        "tr",
        { dataset: { reservationId: r.id } },
        h("td", {}, idCode(r.id)),
        h("td", {}, idCode(r.poolId)),
        h("td", { class: `state ${r.state}` }, r.state),
        h(
          "td",
          {},
          Object.entries(r.resources)
            .map(([name, amount]) => `${name} ${amount}`)
            .join(", "),
        ),
        placementCell(r.placement),
        deliveryCell(r.delivery?.state, r.delivery?.reason, r.delivery?.at),
        h("td", {}, r.reason ?? ""),
        h("td", {}, when(r.createdAt)),
      ),
    );
  const columns = [
    "id",
    "pool",
    "state",
    "resources",
    "placement",
    "delivery",
    "reason",
    "created",
  ];
  byId("reservations").replaceChildren(
    rows.length ? grid(columns, rows) : empty("None pending, placed or active."),
  );
}

// D4: every live or releasing booking on the tenant's nodes, whoever's it is.
function renderBookings(nodes) {
  const bookings = nodes.flatMap((node) => (node.bookings ?? []).map((b) => [node, b]));
  byId("bookings-count").textContent = `(${bookings.length})`;
  const rows = bookings.map(([node, b]) =>
    h(
      "tr",
      { dataset: { reservationId: b.reservationId } },
      h("td", {}, idCode(b.reservationId)),
      h("td", { class: "tenant" }, b.tenantId),
      h("td", { class: "host", title: node.id }, node.hostname),
      h("td", { class: `state ${b.state}` }, b.state),
      h("td", {}, bookedDevices(b, node) ?? "—"),
      h("td", {}, cpusText(b.cpus, b.cpuQuota) ?? "—"),
      h("td", {}, b.memoryBytes === null ? "—" : gib(b.memoryBytes)),
      deliveryCell(b.delivery),
    ),
  );
  const columns = [
    "reservation",
    "tenant",
    "node",
    "state",
    "devices",
    "CPUs",
    "memory",
    "delivery",
  ];
  byId("bookings").replaceChildren(
    rows.length ? grid(columns, rows) : empty("Nothing is booked on this tenant's nodes."),
  );
}

// --- the event log -----------------------------------------------------------------------------

function setLive(state, text) {
  byId("live").className = `live ${state}`;
  byId("live").textContent = text;
}

// The log is read from its start without waiting and without a refresh per page, keeping
// only the newest MAX_EVENTS, up to its end as it is now: a read that gets past nothing
// (`next` == `after`; a page may be empty yet move `next` past events this token may not see,
// B1). Then the panels are refreshed once, for what happened since the first refresh, and the
// log is followed by long-poll (B2): each call answers as soon as there is an event after
// `after`, or empty, its `next` moved past events not shown or (the wait over) not moved;
// either way the next call goes out at once from `next`.
async function follow(run) {
  const { token, tenant } = run.session;
  const signal = run.controller.signal;
  let after = 0;
  let backlog = []; // while catching up: the newest events read so far; null once live
  while (run === active) {
    try {
      const page = await call(
        token,
        "compute/events/list",
        { tenantId: tenant, after, limit: PAGE, waitSeconds: backlog ? 0 : WAIT_SECONDS },
        signal,
      );
      const moved = page.next !== after;
      after = page.next;
      if (backlog && moved) {
        setLive("waiting", "reading the log…");
        backlog = backlog.concat(page.items).slice(-MAX_EVENTS);
      } else if (backlog) {
        addEvents(backlog);
        backlog = null;
        setLive("on", "live");
        refreshSoon(run);
      } else {
        setLive("on", "live");
        if (page.items.length > 0) {
          addEvents(page.items);
          refreshSoon(run);
        }
      }
    } catch (error) {
      failed(run, error, (text) => setLive("stalled", `event log: ${text}; retrying`));
      await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
    }
  }
}

function addEvents(events) {
  const log = byId("events");
  for (const event of events) {
    log.prepend(
      h(
        "li",
        { class: "event", dataset: { seq: event.seq, type: event.type } },
        h("span", { class: "seq" }, `#${event.seq}`),
        h("time", { datetime: event.at }, when(event.at)),
        h("span", { class: "type" }, event.type),
        event.poolId ? idCode(event.poolId) : null,
        h("span", { class: "data" }, JSON.stringify(event.data).slice(0, 240)),
      ),
    );
  }
  while (log.childElementCount > MAX_EVENTS) log.lastElementChild.remove();
}

// --- start -------------------------------------------------------------------------------------

byId("sign-in-form").addEventListener("submit", signIn);
byId("sign-out").addEventListener("click", () => signOut(""));
const session = savedSession();
if (session) start(session);
else showSignIn("");
