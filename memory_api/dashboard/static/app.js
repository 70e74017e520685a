// Memory Butler dashboard: what every page shares (no framework, no build step).
// The token lives in sessionStorage only (gone when the tab closes) and is sent as a bearer header, never in a
// URL or a cookie. All memory text is inserted with textContent: memories are written by agents, not trusted HTML.
"use strict";

const MB = (() => {
  const KEY = "mb_token";
  const token = () => sessionStorage.getItem(KEY);

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "text") el.textContent = v;
      else if (k === "style") el.style.cssText = v;  // CSSOM: allowed by the page's CSP (no inline styles)
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function signOut() {
    sessionStorage.removeItem(KEY);
    location.href = "/";
  }

  function requireToken() {
    if (!token()) location.replace("/?next=" + encodeURIComponent(location.pathname));
  }

  async function api(method, path, params, body) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(params || {})) if (v !== "" && v !== null && v !== undefined) url.searchParams.set(k, v);
    const init = { method, headers: { Authorization: "Bearer " + token() } };
    if (body !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
    const response = await fetch(url, init);
    const data = await response.json().catch(() => ({ message: response.statusText }));
    if (response.status === 401 && location.pathname !== "/") { sessionStorage.removeItem(KEY); requireToken(); }
    if (!response.ok) {
      const err = new Error(data.message || `HTTP ${response.status}`);
      err.status = response.status; err.code = data.error;
      throw err;
    }
    return data;
  }

  function showError(where, err) {
    const box = document.getElementById(where || "errors");
    box.replaceChildren(h("div", { class: "alert", role: "alert" }, err.message || String(err)));
  }

  function clearError(where) { document.getElementById(where || "errors").replaceChildren(); }

  function notice(text, action) {
    const box = document.getElementById("errors");
    box.replaceChildren(h("div", { class: "notice", role: "status" }, text, " ", action || ""));
  }

  const when = (iso) => iso ? new Date(iso).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" }) : "–";
  const day = (iso) => iso ? new Date(iso).toLocaleDateString(undefined, { dateStyle: "medium" }) : "–";

  function ago(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    const units = [["d", 86400], ["h", 3600], ["min", 60]];
    for (const [u, s] of units) if (seconds >= s) return `${Math.floor(seconds / s)} ${u}`;
    return `${Math.round(seconds)} s`;
  }

  // Seed 000: green above 0.8, yellow 0.5 to 0.8, red below 0.5.
  const colour = (c) => (c > 0.8 ? "green" : c >= 0.5 ? "yellow" : "red");
  const bar = (value, cls) => h("div", { class: "bar", title: value.toFixed(2) },
    h("span", { class: cls, style: `width:${Math.max(0, Math.min(1, value)) * 100}%` }));

  async function frame(active) {
    requireToken();
    const me = await api("GET", "/api/me");
    const list = await api("GET", "/api/butlers").catch(() => ({ butlers: [] }));
    const nav = document.getElementById("nav");
    nav.replaceChildren(
      h("a", { href: "/memory", class: active === "fleet" ? "active" : null }, "Fleet memory"),
      ...list.butlers.map((b) => h("a", { href: `/butlers/${encodeURIComponent(b)}/memory` }, b)));
    document.getElementById("who").replaceChildren(
      `${me.tenant_id} · ${me.role}${me.is_admin ? "" : " (read-only)"} `,
      h("button", { id: "sign-out", onclick: signOut }, "Sign out"));
    return me;
  }

  return { h, api, frame, showError, clearError, notice, when, day, ago, colour, bar, token, KEY };
})();
