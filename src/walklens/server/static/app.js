// walklens explorer: the page's core (requests, DOM helpers, tabs). No network but the server itself.
// Every string from a model, a text or the database is inserted with textContent or drawn on a canvas: it
// is never parsed as markup. Each view's script (walks.js, views.js) registers itself in walklens.views.
(function () {
  "use strict";
  var W = window.walklens = {views: {}, info: null};
  // the reports' result renderers and their label helpers (reports/assets/results.js): a document is drawn the
  // same way in a report and here
  W.results = window.walklensResults;
  W.label = W.results.show;  // a token as a visible label
  var token = new URLSearchParams(window.location.search).get("token") || "";
  var pending = {};  // channel -> AbortController of the request in flight

  // ---- DOM helpers: elements with attributes and plain text only ----------------------------------------------
  W.el = function (tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (/^on/i.test(k)) throw new Error("event handler attributes are not allowed");
      e.setAttribute(k, String(attrs[k]));
    });
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  };
  W.add = function (parent, tag, attrs, text) { var e = W.el(tag, attrs, text); parent.appendChild(e); return e; };
  W.clear = function (node) { while (node.firstChild) node.removeChild(node.firstChild); return node; };
  W.$ = function (id) { return document.getElementById(id); };
  W.fmt = function (v, digits) {
    if (v === null || v === undefined) return "-";
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return String(v);
    return Number(v).toPrecision(digits || 4);
  };
  W.table = function (parent, headers, rows, rowClass) {
    var t = W.add(parent, "table", {"class": "wl"}), tr = W.add(t, "tr");
    headers.forEach(function (h) { W.add(tr, "th", {}, h); });
    rows.forEach(function (r, i) {
      var row = W.add(t, "tr", rowClass && rowClass(i) ? {"class": rowClass(i)} : {});
      r.forEach(function (v) { W.add(row, "td", {}, W.fmt(v)); });
    });
    return t;
  };
  W.options = function (select, values, labels, keep) {
    var old = select.value;
    W.clear(select);
    values.forEach(function (v, i) { W.add(select, "option", {value: v}, labels ? labels[i] : v); });
    if (keep && values.indexOf(old) >= 0) select.value = old;
  };

  // ---- plots: the reports' plots.js, fed a spec through the data-spec attribute -----------------------------
  W.heatmap = function (parent, spec) {  // its geometry: the cell under a pointer (at), marks on cells (mark)
    var div = W.add(parent, "div", {"class": "wl-heatmap"});
    div.setAttribute("data-spec", JSON.stringify(spec));
    var geo = window.walklensPlots.heatmap(div);
    geo.div = div;
    return geo;
  };
  W.lines = function (parent, spec) {
    var div = W.add(parent, "div", {"class": "wl-lines"});
    div.setAttribute("data-spec", JSON.stringify(spec));
    window.walklensPlots.lines(div);
    return div;
  };

  // ---- requests: the token in a header; a new request on a channel aborts the one it supersedes -------------
  W.status = function (text, isError) {
    var s = W.$("status");
    s.textContent = text;
    s.className = isError ? "error" : "";
  };
  W.call = function (channel, path, body) {
    if (pending[channel]) pending[channel].abort();
    var ctl = new AbortController();
    pending[channel] = ctl;
    var t0 = performance.now();
    W.status("computing " + channel + " ...");
    return fetch(path, {method: body ? "POST" : "GET", signal: ctl.signal, cache: "no-store",
                        headers: {"X-Walklens-Token": token, "Content-Type": "application/json"},
                        body: body ? JSON.stringify(body) : undefined})
      .then(function (r) {
        return r.json().then(function (d) {
          if (!r.ok) throw new Error(d.error || ("HTTP " + r.status));
          return d;
        }, function (e) {
          if (e.name === "AbortError") throw e;  // superseded while its answer was read: no answer to draw
          throw new Error("HTTP " + r.status + ": the answer is not JSON");
        });
      })
      .then(function (d) {
        if (pending[channel] === ctl) delete pending[channel];
        W.status(channel + ": " + ((performance.now() - t0) / 1000).toFixed(2) + " s");
        return d;
      }, function (e) {
        if (e.name === "AbortError") throw e;  // superseded: the newer request reports
        if (pending[channel] === ctl) delete pending[channel];
        W.status(channel + ": " + e.message, true);
        throw e;
      });
  };
  W.quiet = function (e) { if (e && e.name !== "AbortError") console.warn(e); };

  // ---- state: the text, the model and the active view ------------------------------------------------------
  W.text = function () { return W.$("text").value; };
  W.model = function () { return W.$("model").value; };
  W.modelInfo = function (name) {
    return W.info.models.filter(function (m) { return m.name === (name || W.model()); })[0];
  };
  W.active = "walk";
  var stale = {};  // view -> true when its input changed since it last ran
  var typing = null;  // the run due once the typist pauses; a run started any other way replaces it
  W.run = function () {
    if (typing) { clearTimeout(typing); typing = null; }
    Object.keys(W.views).forEach(function (v) { stale[v] = true; });
    W.show(W.active);
  };
  W.show = function (view) {
    W.active = view;
    document.querySelectorAll("#tabs button").forEach(function (b) {
      b.className = b.getAttribute("data-view") === view ? "active" : ""; });
    document.querySelectorAll(".view").forEach(function (s) {
      s.className = s.id === "view-" + view ? "view active" : "view"; });
    if (stale[view] && W.views[view]) { stale[view] = false; W.views[view].run(); }
  };
  W.rerun = function (view) { return function () { if (W.active === view) W.views[view].run(); else stale[view] = true; }; };

  function start() {
    document.querySelectorAll("#tabs button").forEach(function (b) {
      b.addEventListener("click", function () { W.show(b.getAttribute("data-view")); }); });
    W.$("run").addEventListener("click", W.run);
    W.$("model").addEventListener("change", W.run);
    W.$("text").addEventListener("keydown", function (e) {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); W.run(); } });
    W.$("text").addEventListener("input", function () {  // typing: run once the typist pauses
      if (typing) clearTimeout(typing);
      typing = setTimeout(W.run, 700);
    });
    W.call("info", "/api/info").then(function (info) {
      W.info = info;
      var names = info.models.map(function (m) { return m.name; });
      W.options(W.$("model"), names, info.models.map(function (m) {
        return m.name + " (" + m.family + ", " + m.n_layers + " layers, " + m.dtype + ")"; }));
      Object.keys(W.views).forEach(function (v) { if (W.views[v].init) W.views[v].init(info); });
      document.body.setAttribute("data-ready", "1");
      W.run();
    }, W.quiet);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
