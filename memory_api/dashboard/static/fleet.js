// Fleet memory (/memory): overview cards, knowledge browser, health charts, activity feed.
"use strict";
(() => {
  const { h, api } = MB;
  let cursor = null;

  function card(title, big, lines, id) {
    return h("div", { class: "panel", id }, h("div", { class: "muted" }, title), h("div", { class: "stat" }, big),
      h("div", { class: "kv" }, lines.map(([k, v]) => h("span", {}, `${k} ${v}`))));
  }

  function overview(stats) {
    const f = stats.facts, r = stats.rules, e = stats.episodes;
    const live = f.by_validity.active + f.by_validity.fading;
    document.getElementById("overview").replaceChildren(
      card("Facts", live, Object.entries(f.live_by_permanence), "card-facts"),
      card("Rules", r.total - r.by_validity.retracted, Object.entries(r.by_maturity).map(([k, v]) => [k.replace("_", "-"), v]), "card-rules"),
      card("Active episodes", e.total, [["pending", e.by_status.pending], ["dead letter", e.by_status.dead_letter]], "card-episodes"),
      card("Fading facts", f.by_validity.fading, [["expired", f.by_validity.expired], ["retracted", f.by_validity.retracted]], "card-fading"));
  }

  function chart(title, bins, id) {
    const max = Math.max(1, ...bins.map((b) => b.count));
    const total = bins.reduce((n, b) => n + b.count, 0);
    return h("div", { id }, h("h3", {}, title),
      total === 0 ? h("p", { class: "empty" }, "Nothing to chart yet.") : [
        h("div", { class: "chart" }, bins.map((b) => h("div", {
          class: "col", title: `${b.from}–${b.to}: ${b.count}`, style: `height:${(b.count / max) * 100}%` }))),
        h("div", { class: "chart-axis" }, h("span", {}, "0"), h("span", {}, "0.5"), h("span", {}, "1"))]);
  }

  // Seed 000's bands over active facts, coloured as the fact cards' confidence bars.
  const BANDS = [["below_0.2", "< 0.2", "red"], ["0.2_to_0.5", "0.2–0.5", "red"], ["0.5_to_0.8", "0.5–0.8", "yellow"],
    ["above_0.8", "> 0.8", "green"]];

  function bandChart(bands) {
    const max = Math.max(1, ...BANDS.map(([k]) => bands[k]));
    const total = BANDS.reduce((n, [k]) => n + bands[k], 0);
    return h("div", { id: "chart-confidence" }, h("h3", {}, "Confidence of active facts"),
      total === 0 ? h("p", { class: "empty" }, "No active facts yet.") : [
        h("div", { class: "chart" }, BANDS.map(([k, label, cls]) => h("div", {
          class: `col ${cls}`, title: `${label}: ${bands[k]}`, style: `height:${(bands[k] / max) * 100}%` }))),
        h("div", { class: "chart-axis" }, BANDS.map(([k, label]) => h("span", {}, `${label} (${bands[k]})`)))]);
  }

  function healthPanel(data) {
    const backlog = data.episodes.backlog, eff = data.rules.effectiveness, dead = data.dead_letters;
    const last = backlog.last_consolidation_at;
    document.getElementById("health-body").replaceChildren(
      bandChart(data.facts.active_confidence_bands),
      h("h3", {}, "Episode backlog"),
      h("div", { class: "kv", id: "backlog" },
        h("span", {}, `unconsolidated ${backlog.count}`),
        h("span", {}, `oldest pending ${MB.ago(backlog.oldest_pending_age_seconds)}`),
        h("span", {}, `last consolidation ${last ? MB.ago((Date.now() - Date.parse(last)) / 1000) + " ago" : "never"}`),
        h("span", {}, `dead letters ${dead.episodes + dead.write_intents}`)),
      chart("Rule effectiveness (rated rules)", data.charts.effectiveness_histogram, "chart-effectiveness"),
      h("p", { class: "muted" }, eff.rated ? `${Math.round(eff.helping_share * 100)}% of ${eff.rated} rated rules are helping; ${eff.anti_patterns} anti-patterns.`
        : "No rule has feedback yet."));
  }

  function hitCard(hit) {
    const where = hit.type === "episode" ? hit.butler : hit.scope;
    const href = hit.type === "episode" ? `/butlers/${where}/memory` : (where && where !== "global" ? `/butlers/${where}/memory` : null);
    return h("div", { class: "card hit", "data-id": hit.id },
      h("span", { class: "badge blue" }, hit.type), h("span", { class: "badge" }, where || ""),
      hit.permanence ? h("span", { class: "badge" }, hit.permanence) : null,
      hit.maturity ? h("span", { class: "badge" }, hit.maturity) : null,
      h("div", { class: "content" }, hit.subject ? `${hit.subject} · ${hit.predicate}: ${hit.content}` : hit.content),
      h("div", { class: "muted" }, `score ${hit.score.toFixed(3)}`, href ? [" · ", h("a", { href }, "open butler view")] : ""));
  }

  async function search(event) {
    event.preventDefault();
    const box = document.getElementById("search-results");
    try {
      const data = await api("GET", "/api/memory/search", {
        q: document.getElementById("search-q").value, types: document.getElementById("search-type").value,
        scope: document.getElementById("search-scope").value.trim(),
        permanence: document.getElementById("search-permanence").value });
      box.replaceChildren(...(data.results.length ? data.results.map(hitCard) : [h("p", { class: "empty" }, "No memory matches.")]));
    } catch (err) {
      box.replaceChildren(h("div", { class: "alert", role: "alert" }, err.message));
    }
  }

  function eventRow(e) {
    const label = e.payload && (e.payload.subject ? `${e.payload.subject} · ${e.payload.predicate}` :
      e.payload.from && e.payload.to ? `${e.payload.from} → ${e.payload.to}` : "");
    return h("div", { class: "event", "data-type": e.event_type },
      h("span", { class: "when" }, MB.when(e.occurred_at)), h("span", { class: "badge blue" }, e.event_type),
      h("span", {}, label || (e.entity_id || "").slice(0, 8)), h("span", { class: "muted" }, `by ${e.actor}`));
  }

  async function activity(more) {
    const list = document.getElementById("activity-list");
    const data = await api("GET", "/api/memory/activity", { limit: 25, before: more ? cursor : null });
    cursor = data.next_cursor;
    const rows = data.events.map(eventRow);
    if (more) list.append(...rows);
    else list.replaceChildren(...(rows.length ? rows : [h("p", { class: "empty" }, "No activity yet.")]));
    document.getElementById("activity-more").hidden = cursor === null;
  }

  async function start() {
    try {
      await MB.frame("fleet");
      const data = (await api("GET", "/api/memory/health")).health;
      overview(data);
      healthPanel(data);
      await activity(false);
    } catch (err) {
      MB.showError("errors", err);
    }
    document.getElementById("search-form").addEventListener("submit", search);
    document.getElementById("activity-more").addEventListener("click", () => activity(true).catch((e) => MB.showError("errors", e)));
    document.body.dataset.ready = "1";
  }

  start();
})();
