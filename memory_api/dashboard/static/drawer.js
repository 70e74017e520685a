// The detail drawer: a fact's provenance and supersession chain (with the edit form), a rule's history.
"use strict";
const Drawer = (() => {
  const { h, api } = MB;
  const el = () => document.getElementById("drawer");

  function show(...children) {
    const parts = children.flat(2).filter((c) => c !== null && c !== undefined && c !== false);
    el().replaceChildren(h("button", { class: "close", id: "drawer-close", onclick: close }, "Close"), ...parts);
    el().hidden = false;
  }

  function close() { el().hidden = true; el().replaceChildren(); }

  const section = (title, items, empty) => [h("h3", {}, title),
    !Array.isArray(items) || items.length ? items : h("p", { class: "empty" }, empty)];

  function eventList(events) {
    return section("Audit events", events.map((e) => h("div", { class: "event", "data-type": e.event_type },
      h("span", { class: "when" }, MB.when(e.occurred_at)), h("span", { class: "badge blue" }, e.event_type),
      h("span", { class: "muted" }, `by ${e.actor}${e.request_id ? " · " + e.request_id : ""}`))), "No events.");
  }

  function editForm(fact) {
    const area = h("textarea", { id: "edit-content", "aria-label": "Corrected content" });
    area.value = fact.content;
    const permanence = h("select", { id: "edit-permanence" },
      ["permanent", "stable", "standard", "volatile", "ephemeral"].map((p) => h("option", { selected: p === fact.permanence }, p)));
    const save = async (event) => {
      event.preventDefault();
      try {
        const out = await api("PUT", `/api/memory/facts/${fact.id}`, undefined, { content: area.value, permanence: permanence.value });
        MB.notice("Saved: a new fact supersedes the old one.");
        await Page.loadFacts(false);
        await openFact(out.id, false);
      } catch (err) { MB.showError("drawer-errors", err); }
    };
    return h("form", { id: "edit-form", onsubmit: save }, h("h3", {}, "Correct this fact"),
      h("p", { class: "muted" }, "Saving stores a new fact with the same subject and predicate; this one is kept, struck through."),
      area, h("label", { class: "muted" }, "Permanence ", permanence), " ",
      h("button", { class: "primary", id: "edit-save", type: "submit" }, "Save correction"));
  }

  function chainItem(f, currentId) {
    return h("li", { class: f.id === currentId ? "current" : "", "data-id": f.id },
      h("a", { href: "#", onclick: (e) => { e.preventDefault(); openFact(f.id, false); } }, f.content),
      h("span", { class: "badge" }, f.validity), h("span", { class: "muted" }, ` ${MB.day(f.created_at)}`));
  }

  const linkItem = (l, id) => h("li", {}, l.source_id === id
    ? `${l.relation} → ${l.target_type} ${l.target_id.slice(0, 8)}` : `${l.source_type} ${l.source_id.slice(0, 8)} ${l.relation} this`);

  async function openFact(id, editing) {
    try {
      const d = await api("GET", `/api/memory/facts/${id}`);
      const f = d.fact, c = f.effective_confidence;
      const live = f.validity === "active" || f.validity === "fading";
      show(h("h2", { id: "drawer-title" }, `${f.subject} · ${f.predicate}`), h("div", { id: "drawer-errors" }),
        h("p", { class: "content", id: "drawer-content" }, f.content),
        h("div", { class: "kv" }, h("span", {}, `validity ${f.validity}`), h("span", {}, `scope ${f.scope}`),
          h("span", {}, `permanence ${f.permanence}`), h("span", {}, `source butler ${f.source_butler || "–"}`),
          h("span", {}, `created ${MB.when(f.created_at)}`), h("span", {}, `last confirmed ${MB.day(f.last_confirmed_at)}`)),
        MB.bar(c, MB.colour(c)),
        Page.state.me.is_admin && live && editing ? editForm(f) : null,
        Page.state.me.is_admin && live && !editing ? h("button", { id: "drawer-edit", onclick: () => openFact(id, true) }, "Edit") : null,
        section("Supersession chain (oldest first)", h("ol", { id: "chain" }, d.supersession_chain.map((x) => chainItem(x, f.id))), ""),
        section("Source episodes", d.source_episodes.map((e) => h("div", { class: "card" }, h("span", { class: "badge blue" }, e.butler),
          h("span", { class: "muted" }, ` ${MB.when(e.created_at)}`), h("div", { class: "content" }, e.content))), "No source episode."),
        section("Links", [...d.links_out, ...d.links_in].length ? h("ul", {}, [...d.links_out, ...d.links_in].map((l) => linkItem(l, f.id))) : [], "No links."),
        eventList(d.events));
    } catch (err) { MB.showError("errors", err); }
  }

  async function openRule(id) {
    try {
      const d = await api("GET", `/api/memory/rules/${id}`);
      const r = d.rule;
      show(h("h2", { id: "drawer-title" }, `Rule · ${r.maturity.replace("_", "-")}`),
        h("p", { class: "content" }, r.content),
        h("div", { class: "kv" }, h("span", {}, `scope ${r.scope}`), h("span", {}, `validity ${r.validity}`),
          h("span", {}, `effectiveness ${r.effectiveness_score.toFixed(2)}`), h("span", {}, `source butler ${r.source_butler || "–"}`),
          h("span", {}, `created ${MB.when(r.created_at)}`)),
        section("Application history", d.applications.map((a) => h("div", { class: "event" },
          h("span", { class: "when" }, MB.when(a.occurred_at)),
          h("span", { class: `badge ${a.outcome === "helpful" ? "green" : "red"}` }, a.outcome),
          h("span", { class: "muted" }, `${a.actor}${a.reason ? " · " + a.reason : ""}`))), "Never applied."),
        eventList(d.events));
    } catch (err) { MB.showError("errors", err); }
  }

  document.addEventListener("keydown", (e) => { if (e.key === "Escape") close(); });
  return { openFact, openRule, close };
})();
