// Butler memory (/butlers/{name}/memory): the facts panel and the episode stream; the playbook is playbook.js.
"use strict";
const Page = (() => {
  const { h, api } = MB;
  const name = decodeURIComponent(location.pathname.split("/")[2] || "");
  const base = `/api/butlers/${encodeURIComponent(name)}/memory`;
  const state = { me: null, factOffset: 0, episodeOffset: 0 };
  const val = (id) => document.getElementById(id).value.trim();

  function factFilters() {
    return { subject: val("f-subject"), source_butler: val("f-source"), min_confidence: val("f-min"),
      permanence: val("f-permanence"), validity: val("f-validity") };
  }

  function factCard(f) {
    const c = f.effective_confidence;
    const fading = f.validity === "fading";
    const actions = state.me.is_admin && (f.validity === "active" || fading) ? h("div", { class: "actions" },
      h("button", { class: "edit", onclick: (e) => { e.stopPropagation(); Drawer.openFact(f.id, true); } }, "Edit"),
      h("button", { class: "danger delete", onclick: (e) => { e.stopPropagation(); remove(f); } }, "Delete")) : null;
    const restore = state.me.is_admin && f.validity === "retracted" ? h("div", { class: "actions" },
      h("button", { class: "restore", onclick: (e) => { e.stopPropagation(); restoreFact(f.id); } }, "Restore")) : null;
    return h("div", { class: `card fact ${f.validity}`, id: `fact-${f.id}`, "data-id": f.id, "data-validity": f.validity,
      onclick: () => Drawer.openFact(f.id, false) },
      h("span", { class: "predicate" }, f.predicate), h("span", { class: `badge ${f.permanence === "permanent" ? "blue" : ""}` }, f.permanence),
      f.scope !== "global" ? h("span", { class: "badge" }, f.scope) : null,
      fading ? h("span", { class: "badge yellow" }, "fading") : null,
      f.validity === "retracted" ? h("span", { class: "badge red" }, "deleted") : null,
      h("div", { class: "content" }, f.content),
      MB.bar(c, MB.colour(c)),
      h("div", { class: "muted" }, `confidence ${c.toFixed(2)} · last confirmed ${MB.day(f.last_confirmed_at)}`,
        f.superseded_by_id ? [" · ", h("a", { href: `#fact-${f.superseded_by_id}`, class: "replacement",
          onclick: (e) => { e.stopPropagation(); e.preventDefault(); Drawer.openFact(f.superseded_by_id, false); } }, "replaced by a newer fact")] : ""),
      actions, restore);
  }

  function renderFacts(items, more) {
    const list = document.getElementById("fact-list");
    if (!more) list.replaceChildren();
    let group = more ? list.lastElementChild : null;
    for (const f of items) {
      if (!group || group.dataset.subject !== f.subject) {
        group = h("div", { class: "group", "data-subject": f.subject }, h("span", { class: "subject" }, f.subject));
        list.append(group);
      }
      group.append(factCard(f));
    }
    if (!list.children.length) list.append(h("p", { class: "empty" }, "No facts match these filters."));
  }

  async function loadFacts(more) {
    state.factOffset = more ? state.factOffset : 0;
    const data = await api("GET", `${base}/facts`, { ...factFilters(), limit: 100, offset: state.factOffset });
    renderFacts(data.items, more);
    state.factOffset = data.next_offset;
    document.getElementById("fact-more").hidden = data.next_offset === null;
  }

  async function remove(f) {
    try {
      await api("DELETE", `/api/memory/facts/${f.id}`);
      MB.notice(`Deleted “${f.predicate}”.`, h("button", { id: "undo", onclick: () => restoreFact(f.id) }, "Undo"));
      await loadFacts(false);
    } catch (err) { MB.showError("errors", err); }
  }

  async function restoreFact(id) {
    try {
      await api("POST", `/api/memory/facts/${id}/restore`);
      MB.notice("Restored.");
      await loadFacts(false);
    } catch (err) { MB.showError("errors", err); }
  }

  function episodeRow(e) {
    const status = e.consolidation_status;
    const cls = { consolidated: "green", pending: "yellow", failed: "yellow", dead_letter: "red" }[status] || "";
    return h("details", { class: "card episode", "data-id": e.id, "data-status": status },
      h("summary", {}, h("span", { class: "muted" }, MB.when(e.created_at)), h("span", { class: "badge blue" }, e.butler),
        h("span", { class: `badge ${cls}` }, status.replace("_", " ")), h("span", { class: "badge" }, `importance ${e.importance}`),
        h("div", { class: "content" }, e.content.length > 140 ? e.content.slice(0, 140) + "…" : e.content)),
      h("div", { class: "full" }, e.content),
      e.last_consolidation_error ? h("div", { class: "alert" }, e.last_consolidation_error) : null);
  }

  async function loadEpisodes(more) {
    state.episodeOffset = more ? state.episodeOffset : 0;
    const to = val("e-to");
    const params = { status: val("e-status"), from: val("e-from") ? new Date(val("e-from")).toISOString() : "",
      to: to ? new Date(new Date(to).getTime() + 86400000).toISOString() : "", limit: 50, offset: state.episodeOffset };
    const data = await api("GET", `${base}/episodes`, params);
    const list = document.getElementById("episode-list");
    const rows = data.items.map(episodeRow);
    if (more) list.append(...rows);
    else list.replaceChildren(...(rows.length ? rows : [h("p", { class: "empty" }, "No episodes match these filters.")]));
    state.episodeOffset = data.next_offset;
    document.getElementById("episode-more").hidden = data.next_offset === null;
  }

  function on(id, event, fn) {
    document.getElementById(id).addEventListener(event, (e) => {
      e.preventDefault();
      MB.clearError("errors");
      fn().catch((err) => MB.showError("errors", err));
    });
  }

  async function start() {
    document.getElementById("title").textContent = `${name} · memory`;
    try {
      state.me = await MB.frame("butler");
      await Promise.all([loadFacts(false), Playbook.load(), loadEpisodes(false)]);
    } catch (err) {
      MB.showError("errors", err);
    }
    on("fact-filters", "submit", () => loadFacts(false));
    on("fact-more", "click", () => loadFacts(true));
    on("episode-filters", "submit", () => loadEpisodes(false));
    on("episode-more", "click", () => loadEpisodes(true));
    document.body.dataset.ready = "1";
  }

  document.addEventListener("DOMContentLoaded", start);
  return { name, base, state, loadFacts };
})();
