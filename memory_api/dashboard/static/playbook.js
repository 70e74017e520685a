// The playbook panel: rules grouped Proven → Established → Candidate, then anti-patterns; admin actions.
"use strict";
const Playbook = (() => {
  const { h, api } = MB;
  const SECTIONS = [["proven", "Proven"], ["established", "Established"], ["candidate", "Candidate"], ["anti_pattern", "Anti-patterns"]];

  async function act(rule, action) {
    MB.clearError("errors");
    try {
      const out = await api("POST", `/api/memory/rules/${rule.id}/${action}`);
      MB.notice(action === "disable" ? "Rule disabled." : `Rule is now ${out.maturity}.`,
        action === "disable" ? h("button", { id: "undo", onclick: () => act(rule, "restore") }, "Undo") : "");
      await load();
    } catch (err) { MB.showError("errors", err); }
  }

  function ruleCard(r) {
    const anti = r.maturity === "anti_pattern";
    const live = r.validity === "active" || r.validity === "fading";
    const button = (label, action, enabled) => h("button", { class: action, disabled: !enabled,
      onclick: (e) => { e.stopPropagation(); act(r, action); } }, label);
    const actions = Page.state.me.is_admin && live ? h("div", { class: "actions" },
      button("Promote", "promote", r.maturity === "candidate" || r.maturity === "established"),
      button("Demote", "demote", r.maturity === "proven" || r.maturity === "established"),
      button("Disable", "disable", true)) : null;
    return h("div", { class: `card rule ${anti ? "anti" : ""}`, id: `rule-${r.id}`, "data-id": r.id, onclick: () => Drawer.openRule(r.id) },
      anti ? h("span", { title: "anti-pattern", "aria-label": "warning" }, "⚠ ") : null,
      h("span", { class: "badge" }, r.scope),
      h("div", { class: "content" }, r.content),
      MB.bar(r.effectiveness_score, "blue"),
      h("div", { class: "muted" }, `effectiveness ${r.effectiveness_score.toFixed(2)} · applied ${r.applied_count} · ✓ ${r.success_count} · ✗ ${r.harmful_count}`),
      actions);
  }

  async function load() {
    const data = await api("GET", `${Page.base}/rules`, { validity: "active,fading", limit: 200 });
    const list = document.getElementById("rule-list");
    list.replaceChildren();
    for (const [maturity, title] of SECTIONS) {
      const rules = data.items.filter((r) => r.maturity === maturity);
      list.append(h("section", { class: "maturity", id: `section-${maturity}` }, h("h3", {}, `${title} (${rules.length})`),
        rules.length ? rules.map(ruleCard) : h("p", { class: "empty" }, "None.")));
    }
  }

  return { load };
})();
