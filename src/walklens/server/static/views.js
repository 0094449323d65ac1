// walklens explorer: attention & kernels, power & steering, sweeps, steering cards, patching. Text only (textContent, canvas, SVG text).
(function () {
  "use strict";
  var W = window.walklens, $ = W.$;
  function int(id, dflt) { var v = parseInt($(id).value, 10); return isNaN(v) ? dflt : v; }

  // a [layers, heads] map (drawn by the reports' results.js): clicking a cell selects that layer and head
  function selects(geo) {
    geo.canvas.addEventListener("click", function (ev) {
      var c = geo.at(ev);
      if (!c) return;
      $("attn-layer").value = c.row; $("attn-head").value = c.col;
      attentionRun();
    });
  }

  // ---- attention ---------------------------------------------------------------------------------------------
  function attentionRun() {
    W.call("attention", "/api/attention", {model: W.model(), text: W.text(), layer: int("attn-layer", -1),
      head: int("attn-head", 0), query: int("attn-query", -1)}).then(function (d) {
      var out = W.clear($("attention-out")), c = d.cluster;  // reports/heads.py cluster_document
      W.add(out, "h3", {}, "layer " + d.layer + ", head " + d.head + ": attention (rows: queries, columns: keys)" +
        (d.block > 1 ? "; mean over " + d.block + " x " + d.block + " positions" : ""));
      var labels = d.labels.map(W.label);
      W.heatmap(out, {z: d.map, row_labels: labels, col_labels: labels, vmin: 0,
        cell: Math.max(4, Math.min(22, Math.floor(700 / Math.max(labels.length, 1))))});
      W.add(out, "h3", {}, "cluster & aggregate: query " + c.position + " '" + W.label(d.tokens[c.position]) +
        "' moves " + W.fmt(c.foreign_mass, 3) + " of the way to the centroid of the other positions (self mass " +
        W.fmt(c.self_mass, 3) + ")");
      W.table(out, ["|centroid - x_t|", "|foreign centroid - x_t|", "cos(x_t, centroid)", "|head output|"],
        [[c.move_distance, c.foreign_distance, c.cos_query_centroid, c.head_output_norm]]);
      W.table(out, ["key position", "token", "membership A[t, s]"], c.top_members.map(function (m) {
        return [m[0], W.label(m[1]), m[2]]; })).setAttribute("id", "attn-members");
      var grid = W.add(out, "div", {"class": "side-by-side"});  // the heads report's maps, drawn by its function
      [W.results.selfMass(grid, d.self_mass)].concat(W.results.headStats(grid, d.head_stats)).forEach(selects);
      W.add(out, "p", {"class": "note"}, "click a cell of the layer x head maps to show that head");
      out.setAttribute("data-rendered", "1");
    }, W.quiet);
  }
  function kernelsRun() {
    W.call("kernels", "/api/kernels", {model: W.model()}).then(function (d) {
      var out = W.clear($("kernels-out"));
      W.add(out, "h2", {}, "position kernels (" + d.scheme + ", " + d.units + ")");
      W.add(out, "p", {"class": "note"}, d.estimator);
      d.stacks.forEach(function (s) {  // reports/kernels.py stack_document, logit units, drawn as the report draws it
        var fr = s.fractions;
        W.table(out, ["stack", "negative self-bias", "far-amplifying", "local", "flat"],
          [[s.stack || "model", fr.negative_self, fr.far_amplifying, fr.local, fr.flat]]);
        W.results.kernelStack(out, s, {meanOf: s.mean_of_heads});
      });
      out.setAttribute("data-rendered", "1");
    }, W.quiet);
  }
  W.views.attention = {run: attentionRun};
  ["attn-layer", "attn-head", "attn-query"].forEach(function (id) { $(id).addEventListener("change", W.rerun("attention")); });
  $("kernels-run").addEventListener("click", kernelsRun);

  // ---- power and steering ----------------------------------------------------------------------------------
  // the replies are the power and steering reports' documents, drawn by the reports' own script (results.js)
  function powerRun() {
    W.call("power", "/api/power", {model: W.model(), text: W.text()}).then(function (d) {
      var out = W.clear($("power-out"));
      W.add(out, "h3", {}, "alignment of the text's tokens with v1(F_l) through depth (" + d.alignment.n_tokens +
        " tokens)");
      W.results.draw.alignment(out, d.alignment);
      W.add(out, "h3", {}, "spectra of F = W_V W_O per layer");
      W.results.draw.spectra(out, d.spectra);
      out.setAttribute("data-rendered", "1");
    }, W.quiet);
  }
  function steerRun() {
    var layers = $("steer-layers").value.split(",").map(function (s) { return parseInt(s, 10); })
      .filter(function (v) { return !isNaN(v); });
    W.call("steering", "/api/steer", {model: W.model(), text: W.text(), target: $("steer-target").value,
      layers: layers, alpha: parseFloat($("steer-alpha").value), method: $("steer-method").value,
      max_new_tokens: int("steer-steps", 12)}).then(function (d) {
      var out = W.clear($("steer-out")), grid = W.add(out, "div", {"class": "side-by-side"});
      var un = d.rows[0], st = d.rows[d.rows.length - 1];  // alpha 0, then alpha
      [["unsteered (alpha = 0)", un, "steer-unsteered"], ["steered (" + st.method + ", alpha = " + st.alpha +
        ", layers " + st.layers.join(", ") + ")", st, "steer-steered"]].forEach(function (s) {
        var col = W.add(grid, "div", {});
        W.add(col, "h3", {}, s[0]);
        var box = W.add(col, "div", {"class": "continuation", id: s[2]});
        W.add(box, "span", {"class": "p"}, W.text());
        W.add(box, "span", {}, s[1].text);
      });
      W.add(out, "p", {"class": "note"}, "target token '" + W.label(d.target_token) + "': its probability and rank " +
        "as the next token, the continuation's perplexity under the unsteered model, the push along u");
      W.results.draw.steering(out, d);
      W.add(out, "p", {"class": "note"}, "reach |P u| per layer (how much of u the layer's value space reads): " +
        Object.keys(d.reach).map(function (l) { return "L" + l + " " + W.fmt(d.reach[l], 3); }).join(", "));
      out.setAttribute("data-rendered", "1");
    }, W.quiet);
  }
  W.views.power = {run: powerRun};
  $("steer-run").addEventListener("click", steerRun);

  // ---- sweeps ----------------------------------------------------------------------------------------------
  var SVG = "http://www.w3.org/2000/svg";
  function svg(parent, tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    if (text !== undefined) e.textContent = String(text);
    parent.appendChild(e);
    return e;
  }
  function histogram(parent, dist, marks) {  // bars of schemes per accuracy bin, with vertical marks
    var Wd = 640, H = 200, L = 40, B = 30, n = dist.hist.length, max = Math.max.apply(null, dist.hist.concat([1]));
    var s = svg(parent, "svg", {width: Wd, height: H, "class": "bars"});
    var x = function (v) { return L + (Wd - L - 10) * v; }, y = function (c) { return (H - B) * (1 - c / max); };
    dist.hist.forEach(function (c, i) {
      var r = svg(s, "rect", {x: x(dist.hist_edges[i]) + 1, y: y(c), width: (Wd - L - 10) / n - 2, height: H - B - y(c)});
      svg(r, "title", {}, c + " schemes in [" + W.fmt(dist.hist_edges[i], 2) + ", " + W.fmt(dist.hist_edges[i + 1], 2) + ")");
    });
    [0, 0.25, 0.5, 0.75, 1].forEach(function (v) {
      svg(s, "text", {x: x(v), y: H - 12, "font-size": 10, "text-anchor": "middle"}, v); });
    svg(s, "text", {x: L - 4, y: 10, "font-size": 10, "text-anchor": "end"}, max);
    marks.forEach(function (m, k) {
      if (m[1] === null) return;
      svg(s, "line", {x1: x(m[1]), x2: x(m[1]), y1: 0, y2: H - B, stroke: m[2], "stroke-width": 2, "stroke-dasharray": "4 2"});
      svg(s, "text", {x: x(m[1]) + 3, y: 12 + 12 * k, "font-size": 10, fill: m[2]}, m[0]);
    });
  }
  var runs = [];
  function sweepsInit(info) {
    if (!info.db) return;
    W.call("sweeps", "/api/sweeps").then(function (d) {
      runs = d.runs;
      W.options($("sweeps-run"), runs.map(function (r) { return String(r.id); }), runs.map(function (r) {
        return r.model + " · test " + r.test + " · " + r.shots + "-shot · " + r.n_items + " items"; }));
    }, W.quiet);
  }
  function sweepsRun(resetFilters) {
    var out = W.clear($("sweeps-out"));
    if (!W.info.db) { W.add(out, "p", {"class": "note"}, "no database: start walklens serve with --db PATH"); return; }
    if (!$("sweeps-run").value) { W.add(out, "p", {"class": "note"}, "the database holds no sweep run"); return; }
    var filters = {};
    if (resetFilters !== true) document.querySelectorAll("#sweeps-filters select").forEach(function (s) {
      if (s.value) filters[s.getAttribute("data-param")] = s.value; });
    W.call("sweep", "/api/sweeps/run", {run: parseInt($("sweeps-run").value, 10),
      metric: $("sweeps-metric").value || "acc", filters: filters}).then(function (d) {
      var m = d.summary, fbox = W.clear($("sweeps-filters"));
      W.options($("sweeps-metric"), d.metrics, null, true);
      Object.keys(d.parameters).forEach(function (p) {
        var lab = W.add(fbox, "label", {}, p + " ");
        var sel = W.add(lab, "select", {"data-param": p});
        W.options(sel, [""].concat(d.parameters[p]), ["(any)"].concat(d.parameters[p]));
        sel.value = d.filters[p] || "";
        sel.addEventListener("change", sweepsRun);
      });
      W.add(out, "h3", {}, d.n_matching + " of " + d.n_schemes + " schemes match; " + d.metric + " across them");
      histogram(out, m.distribution, [["chance", m.distribution.chance, "#000"], ["baseline", m.baseline, "#c0392b"],
        ["in-sample best", m.in_sample.acc, "#e67e22"], [m.kfold.k + "-fold held-out best", m.kfold.acc, "#27ae60"]]);
      var est = [["in-sample best", m.in_sample.scheme, m.in_sample.acc, m.in_sample.lo, m.in_sample.hi, m.in_sample.norm_score]];
      m.split.forEach(function (s) { est.push([s.how, s.scheme, s.acc, s.lo, s.hi, s.norm_score]); });
      var folds = m.kfold.fold_schemes.filter(function (f, i) { return m.kfold.fold_schemes.indexOf(f) === i; });
      est.push([m.kfold.k + "-fold held-out (pooled)", folds.join("\n"), m.kfold.acc, m.kfold.lo,
        m.kfold.hi, m.kfold.norm]);
      if (m.standard) est.push(["standard scheme", m.standard.scheme, m.standard.acc, null, null, m.standard.norm]);
      W.table(out, ["estimate", "scheme(s)", d.metric, "95% lo", "95% hi", "normalised"], est);
      W.add(out, "h3", {}, "top schemes");
      W.table(out, ["rank", "scheme", d.metric, "normalised"], m.top10.map(function (t) {
        return [t.rank, t.scheme, t.acc, t.norm]; })).setAttribute("id", "sweeps-top");
      var rows = [];
      Object.keys(m.marginals).forEach(function (p) { m.marginals[p].forEach(function (v) {
        rows.push([p, v.value, v.n, v.mean, v.best, v.mean_norm]); }); });
      W.add(out, "h3", {}, "marginal effects (mean and best over the matching schemes with each value)");
      W.table(out, ["parameter", "value", "schemes", "mean", "best", "mean normalised"], rows);
      out.setAttribute("data-rendered", "1");
    }, W.quiet);
  }
  W.views.sweeps = {run: sweepsRun, init: sweepsInit};
  $("sweeps-run").addEventListener("change", function () { sweepsRun(true); });
  $("sweeps-metric").addEventListener("change", sweepsRun);

  // ---- steering cards: the report's own parts (reports/steercard.py view), drawn by results.js ----------------
  function cardsInit(info) {
    if (!info.cards) return;
    W.call("cards", "/api/cards").then(function (d) {
      W.options($("cards-card"), d.cards.map(function (c) { return String(c.id); }), d.cards.map(function (c) {
        return c.file + " · " + c.model + " · " + c.set + " · " + c.n_cells + " cells"; }));
      if (W.active === "cards") cardsRun();
    }, W.quiet);
  }
  function cardsRun() {
    var out = W.clear($("cards-out"));
    if (!W.info.cards) {
      W.add(out, "p", {"class": "note"}, "no steering card: start walklens serve with --card FILE (the --json of " +
        "walklens steer --card SET)");
      return;
    }
    if (!$("cards-card").value) return;  // the list is on its way (cardsInit draws the first card)
    W.call("card", "/api/card", {card: parseInt($("cards-card").value, 10)}).then(function (d) {
      out = W.clear($("cards-out"));
      W.add(out, "h2", {}, d.title);
      W.results.draw.parts(out, d.parts);
      out.setAttribute("data-rendered", "1");
    }, W.quiet);
  }
  W.views.cards = {run: cardsRun, init: cardsInit};
  $("cards-card").addEventListener("change", cardsRun);

  // ---- patching: the documents given at start (walklens serve --patch FILE), drawn by results.js as in a report -
  function patchingInit(info) {
    if (!info.patches) return;
    W.call("patches", "/api/patches").then(function (d) {
      W.options($("patching-doc"), d.patches.map(function (p) { return String(p.id); }), d.patches.map(function (p) {
        return p.file + " · " + p.title; }));
      if (W.active === "patching") patchingRun();
    }, W.quiet);
  }
  function patchingRun() {
    var out = W.clear($("patching-out"));
    if (!W.info.patches) {
      W.add(out, "p", {"class": "note"}, "no patching document: start walklens serve with --patch FILE (the --json " +
        "of walklens patch, or the walk beside the test: docs/results/walk_beside_patch.json)");
      return;
    }
    if (!$("patching-doc").value) return;  // the list is on its way (patchingInit draws the first document)
    W.call("patch", "/api/patch", {patch: parseInt($("patching-doc").value, 10)}).then(function (d) {
      out = W.clear($("patching-out"));
      W.add(out, "h2", {}, d.title);
      W.add(out, "p", {"class": "note"}, d.subtitle);
      if (d.patching) W.results.draw.patching(out, d.patching); else W.results.draw.walk_beside(out, d.walk_beside);
      out.setAttribute("data-rendered", "1");
    }, W.quiet);
  }
  W.views.patching = {run: patchingRun, init: patchingInit};
  $("patching-doc").addEventListener("change", patchingRun);
})();
