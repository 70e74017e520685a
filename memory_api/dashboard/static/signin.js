// Sign in: check the token against /api/me, keep it in sessionStorage, go where the person was heading.
"use strict";
document.getElementById("signin").addEventListener("submit", async (event) => {
  event.preventDefault();
  const value = document.getElementById("token").value.trim();
  sessionStorage.setItem(MB.KEY, value);
  try {
    await MB.api("GET", "/api/me");
    const next = new URLSearchParams(location.search).get("next");
    location.href = next && next.startsWith("/") && !next.startsWith("//") ? next : "/memory";
  } catch (err) {
    sessionStorage.removeItem(MB.KEY);
    MB.showError("errors", err.status === 401 ? new Error("That token is unknown or revoked.") : err);
  }
});
