// Live updates: the server sends "change" over Server-Sent Events when the store is written
// to; the page then fetches itself again and swaps its <main> (no inline script: see the CSP).
(function () {
  "use strict";
  var body = document.body;
  if (!body.hasAttribute("data-live")) return;
  var context = body.getAttribute("data-live");
  var url = "/api/events" + (context ? "?c=" + encodeURIComponent(context) : "");
  var busy = false;
  function refresh() {
    if (busy) return;
    busy = true;
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (text === null) return;
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.getElementById("live");
        var main = document.getElementById("live");
        if (fresh && main) main.replaceWith(document.adoptNode(fresh));
        body.setAttribute("data-updated", String(Date.now()));
      })
      .finally(function () { busy = false; });
  }
  var source = new EventSource(url);
  source.addEventListener("change", refresh);
})();
