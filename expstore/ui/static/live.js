// The live page: asks the server for its numbers every few seconds and redraws them in
// place (no reload). Text goes in with textContent; the charts are SVG the server drew.
(function () {
  "use strict";
  var root = document.getElementById("live");
  if (!root) { return; }
  var source = root.getAttribute("data-source");
  var every = Math.max(1, parseFloat(root.getAttribute("data-every")) || 3) * 1000;

  function text(id, value) {
    var el = document.getElementById(id);
    if (el) { el.textContent = value; }
  }

  function draw(id, svg) {
    var el = document.getElementById(id);
    if (el) { el.innerHTML = svg; }
  }

  function render(data) {
    text("rows", String(data.rows));
    text("rate", data.rows_per_s === null ? "—" : data.rows_per_s.toFixed(1));
    text("version", data.policy_version === null ? "none" : String(data.policy_version));
    text("success", data.success === null ? "—" : Math.round(data.success * 100) + "%");
    text("tasks", String(data.tasks));
    Object.keys(data.charts).forEach(function (name) { draw("chart-" + name, data.charts[name]); });
    var body = document.querySelector("#claims tbody");
    while (body.firstChild) { body.removeChild(body.firstChild); }
    var names = Object.keys(data.claims).sort();
    if (!names.length) {
      var empty = body.insertRow();
      var cell = empty.insertCell();
      cell.colSpan = 3;
      cell.className = "muted";
      cell.textContent = "no claim held";
    }
    names.forEach(function (name) {
      var row = body.insertRow();
      row.insertCell().textContent = name;
      var leased = row.insertCell();
      leased.className = "num";
      leased.textContent = String(data.claims[name].leased);
      var expired = row.insertCell();
      expired.className = "num";
      expired.textContent = String(data.claims[name].expired);
    });
    var limit = data.rate_limit;
    text("ratelimit", limit === null ? "no rate limit" :
      limit.sampled + " rows sampled for " + limit.inserted + " inserted (" +
      limit.samples_per_insert + " samples per insert, min_size " + limit.min_size + ")");
    text("updated", "updated " + new Date(data.at * 1000).toLocaleTimeString());
  }

  function tick() {
    fetch(source, { cache: "no-store" })
      .then(function (r) { return r.json(); })
      .then(function (data) {
        if (data.error) { text("updated", "error: " + data.error); } else { render(data); }
      })
      .catch(function (e) { text("updated", "cannot reach the server: " + e); })
      .finally(function () { window.setTimeout(tick, every); });
  }
  tick();
}());
