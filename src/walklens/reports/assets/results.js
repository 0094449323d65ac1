// walklens result renderers: each draws one result's document (the dict `document()` of reports/<topic>.py
// writes as --json, or a part of it) into an element.  A report embeds the documents it draws (data-doc) and
// this script draws them on load; the explorer (walklens serve) calls the same functions on the documents its
// API sends.  So every field is read here once, for both.  Every string from a model, a text or a database is
// inserted with textContent or drawn on a canvas, never parsed as markup.  Needs plots.js (walklensPlots).
(function () {
  "use strict";

  // ---- text: elements with plain text, a token as a label ----------------------------------------------------
  function el(parent, tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    if (text !== undefined && text !== null) e.textContent = String(text);
    parent.appendChild(e);
    return e;
  }
  function hex(n, width) { var h = n.toString(16); while (h.length < width) h = "0" + h; return h; }
  var UNPRINTABLE = /[\p{C}\p{Z}]/u;  // what Python's str.isprintable() refuses (the space aside)
  // a string as Python's repr() writes it, quotes included: what reports/html.py's show() builds on
  function quote(s) {
    s = String(s);
    var q = s.indexOf("'") >= 0 && s.indexOf("\"") < 0 ? "\"" : "'", out = "";
    Array.from(s).forEach(function (ch) {
      var c = ch.codePointAt(0);
      if (ch === q || ch === "\\") out += "\\" + ch;
      else if (ch === "\t") out += "\\t";
      else if (ch === "\n") out += "\\n";
      else if (ch === "\r") out += "\\r";
      else if (c < 0x20 || c === 0x7f) out += "\\x" + hex(c, 2);
      else if (c < 0x7f || !UNPRINTABLE.test(ch)) out += ch;
      else out += c <= 0xff ? "\\x" + hex(c, 2) : c <= 0xffff ? "\\u" + hex(c, 4) : "\\U" + hex(c, 8);
    });
    return q + out + q;
  }
  // a token as a visible label (reports/html.py show()): whitespace and control characters escaped
  function show(s) { return s ? quote(s).slice(1, -1) : "∅"; }
  // a text with its control characters escaped visibly, tabs and newlines kept (reports/html.py visible())
  function visible(s) {
    return String(s).replace(/[\x00-\x08\x0b-\x1f\x7f-\x9f]/g, function (ch) {
      return ch === "\r" ? "\\r" : "\\x" + hex(ch.charCodeAt(0), 2); });
  }
  function fmt(v) {  // a number as "{:.4g}" writes it
    if (v === null || v === undefined) return "-";
    if (typeof v !== "number") return String(v);
    return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)));
  }
  function table(parent, headers, rows) {
    var t = el(parent, "table", {"class": "wl"}), head = el(t, "tr");
    headers.forEach(function (h) { el(head, "th", {}, h); });
    rows.forEach(function (r) {
      var tr = el(t, "tr");
      r.forEach(function (v) { el(tr, "td", {}, typeof v === "string" ? visible(v) : fmt(v)); });
    });
    return t;
  }
  function plot(parent, kind, spec, title) {  // kind: "lines" or "heatmap" of plots.js; returns what it returns
    if (title) el(parent, "h3", {}, title);
    var div = el(parent, "div", {"class": "wl-" + kind});
    div.setAttribute("data-spec", JSON.stringify(spec));
    return window.walklensPlots[kind](div);
  }
  function where(list, test) {
    var out = [];
    list.forEach(function (v, i) { if (test(v)) out.push(i); });
    return out;
  }
  function range(n) { var out = []; for (var i = 0; i < n; i++) out.push(i); return out; }

  // the curves a document names (`curves`: name, the field of y, an optional band of two fields, dash), at the
  // indices `sel` of its fields (a number is the same at every index)
  function curves(doc, sel) {
    var at = function (key) {
      var v = doc[key];
      return sel.map(function (i) { return Array.isArray(v) ? v[i] : v; });
    };
    return doc.curves.map(function (c) {
      var s = {name: c.name, y: at(c.y), dash: !!c.dash};
      if (c.band) s.band = [at(c.band[0]), at(c.band[1])];
      return s;
    });
  }

  // ---- the encoding walk's rank maps (seed 000, sec. 2.2.2, A.2): reports/walk.py rank_map_document -----------
  function rankZ(r) { return r === null || r < 0 ? null : Math.log(1 + r) / Math.LN10; }  // colour: log10(1 + rank)
  // the rank of w_t (which: "input") or of w_t+1 ("next") at each point (rows) and position (columns; a block of
  // positions when doc.block > 1), the escape points marked: a walk's rank_map_document on a report's page, the
  // explorer's /api/walk reply in its walk and compare views (walks.js).  opts: title, vmax (the top of the colour
  // scale; default: the largest rank shown), note(i) (row i's note in its tooltips), nearest ([row][column]: each
  // cell's nearest tokens, in its tooltip).  Returns the heatmap's geometry (plots.js).
  function rankMap(parent, doc, which, opts) {
    opts = opts || {};
    var ranks = which === "input" ? doc.rank_of_input : doc.rank_of_next, b = doc.block || 1;
    var cols = doc.columns.map(function (c, j) { return b > 1 ? show(c) : j + ": " + show(c); });
    var hover = doc.points.map(function (p, i) {
      return doc.columns.map(function (c, j) {
        var next = doc.rank_of_next[i][j];
        var s = (opts.note ? opts.note(i) : "") + (b > 1 ? "best ranks in block\n" : "") + "rank(w_t) = " +
          doc.rank_of_input[i][j] + "\nrank(w_t+1) = " + (next === null || next < 0 ? "-" : next);
        if (b === 1 && doc.escape_point[j] === i) s += "\nescape: w_t+1 first outranks w_t here";
        if (b === 1 && doc.escape_stable[j] === i) s += "\nw_t+1 stays ahead from here";
        if (opts.nearest) s += "\nnearest: " + opts.nearest[i][j].map(quote).join(", ");
        return s;
      });
    });
    var geo = plot(parent, "heatmap", {z: ranks.map(function (row) { return row.map(rankZ); }), row_labels: doc.points,
      col_labels: cols, hover: hover, vmin: 0, vmax: opts.vmax === undefined ? null : opts.vmax,
      cell: Math.max(4, Math.min(22, Math.floor(1100 / Math.max(cols.length, 1))))}, opts.title);
    if (b === 1) doc.escape_point.forEach(function (p, t) {
      var q = doc.escape_stable[t];
      if (p !== null && p >= 0) geo.mark(p, t, "#e0002a");
      if (q !== null && q >= 0) geo.mark(q, t, "#ffffff", true);
    });
    return geo;
  }
  function rankMaps(parent, doc) {  // rank_map_document: both maps of a report's walk, each cell's nearest tokens
    [["input", "w_t"], ["next", "w_t+1"]].forEach(function (w) {
      rankMap(parent, doc, w[0], {nearest: doc.nearest, title: "rank of " + w[1] + " at each point, log10(1 + " +
        "rank): dark = near (red box: w_t+1 first outranks w_t; white dot: it stays ahead; hover: nearest tokens)"});
    });
  }

  // ---- similarity maps (seed 000, Figs. 3, 11, 12): reports/simmap.py view_document, or the explorer's reply -------
  function quantile(sorted, q) {  // linear between neighbours, as torch.quantile
    var x = q * (sorted.length - 1), i = Math.floor(x);
    return i + 1 < sorted.length ? sorted[i] + (x - i) * (sorted[i + 1] - sorted[i]) : sorted[i];
  }
  // each map of doc.maps ([positions, positions], or blocks of doc.block positions, a label each), coloured over
  // its 1st-99th percentile off the diagonal (a few huge entries do not wash it out; the tooltip has every value),
  // diverging when both signs occur; returns the maps' geometry
  function similarityMaps(parent, doc) {
    var labels = doc.labels.map(show);
    return Object.keys(doc.maps).map(function (key) {
      var z = doc.maps[key], n = z.length, off = [], lo, hi;
      z.forEach(function (row, i) {
        row.forEach(function (v, j) { if (v !== null && (i !== j || n === 1)) off.push(v); });
      });
      off.sort(function (a, b) { return a - b; });
      lo = off.length ? quantile(off, 0.01) : 0; hi = off.length ? quantile(off, 0.99) : 1;
      if (doc.scale) { lo = doc.scale[0]; hi = doc.scale[1]; }  // maps compared side by side: one scale
      var diverging = lo < 0 && 0 < hi, m = Math.max(-lo, hi);
      if (diverging) { lo = -m; hi = m; }
      el(parent, "p", {"class": "note"}, "colour range " + fmt(lo) + " .. " + fmt(hi) +
        (doc.scale ? " (shared by the maps compared)" : " (1st-99th percentile off the diagonal)") +
        "; min " + fmt(off[0]) + ", max " + fmt(off[off.length - 1]));
      return plot(parent, "heatmap", {z: z, row_labels: labels, col_labels: labels, diverging: diverging,
        vmin: hi > lo ? lo : null, vmax: hi > lo ? hi : null,
        cell: Math.max(4, Math.min(24, Math.floor(800 / Math.max(n, 1))))},
        key + ": " + (/cosine$/.test(key) ? "cosine" : "inner product") + " between every pair of positions");
    });
  }

  // ---- attention heads and position kernels (seed 000, sec. 2.2.1, A.2, A.3): reports/heads.py, kernels.py -----
  // a [layers, heads] map in a box of its own (its title, the map): columns h<head>; returns its geometry
  function layerHeadMap(parent, title, z, rows, spec) {
    return plot(el(parent, "div", {}), "heatmap", Object.assign({z: z, row_labels: rows,
      col_labels: (z[0] || []).map(function (v, h) { return "h" + h; }), cell: 18}, spec), title);
  }
  // self_mass_document: each head's mean self mass A_h[t, t] over its value under uniform attention, as log2 (below
  // 0: the query's own position attenuated); returns the map's geometry
  function selfMass(parent, doc) {
    var rows = doc.mass.map(function (r, l) { return "L" + l; });
    var z = doc.mass.map(function (r, l) { return r.map(function (m, h) {
      var u = doc.uniform[l][h];
      return m === null || u === null || !(m > 0 && u > 0) ? null : Math.log(m / u) / Math.LN2; }); });
    var hover = doc.mass.map(function (r, l) { return r.map(function (m, h) {
      return "self mass " + Number(m).toFixed(3) + ", uniform " + Number(doc.uniform[l][h]).toFixed(3); }); });
    return layerHeadMap(parent, "self mass over uniform, log2 (per layer and head)", z, rows,
      {hover: hover, diverging: true});
  }
  // head_stats_document: |W_vo,h|, |W_qk,h| and W_vo,h's copying score per layer and head (factored, A.3); returns
  // the three maps' geometry
  function headStats(parent, doc) {
    var rows = doc.layers.map(function (l) { return (doc.stack ? doc.stack + " " : "") + "L" + l; });
    var maps = [layerHeadMap(parent, "||W_vo,h||_F", doc.vo_norm, rows, {}),
                layerHeadMap(parent, "||W_qk,h||_F", doc.qk_norm, rows, {})];
    if (doc.qk_note) el(parent, "p", {"class": "note"}, doc.qk_note);
    maps.push(layerHeadMap(parent, "W_vo copying score: sum Re(eig) / sum |eig| (+1 copies, -1 negates)",
                           doc.vo_copying, rows, {diverging: true, vmin: -1, vmax: 1,
                           legend: "red: the head copies what it attends to (+1); blue: it negates it (-1)"}));
    return maps;
  }
  // stack_document: every kernel of a stack (a row per layer and head; per layer when opts.meanOf: each layer's
  // mean over that many heads) minus its value at distance 0, logit units; the tooltip: its class, its value and
  // 95 % interval where the document holds them; returns the map's geometry
  function kernelStack(parent, doc, opts) {
    opts = opts || {};
    var at0 = doc.distances.indexOf(0), rows = [], z = [], hover = [];
    doc.log_values.forEach(function (perHead, r) {
      var layer = doc.layers[r] === null ? "" : "L" + doc.layers[r] + " ";
      perHead.forEach(function (v, h) {
        rows.push(opts.meanOf ? layer + "(mean of " + opts.meanOf + " heads)" : layer + "h" + h);
        z.push(v.map(function (x) { return x === null || v[at0] === null ? null : x - v[at0]; }));
        hover.push(v.map(function (x, j) {
          var s = doc.labels.length ? doc.labels[r][h] : "";
          if (doc.values) s += "; value " + fmt(doc.values[r][h][j]);
          if (doc.ci95) s += " +- " + Number(doc.ci95[r][h][j]).toPrecision(2);
          return s; }));
      });
    });
    return plot(parent, "heatmap", {z: z, row_labels: rows, col_labels: doc.distances.map(String), hover: hover,
      diverging: true, cell: Math.max(3, Math.min(16, Math.floor(900 / doc.distances.length)))},
      (doc.stack || "model") + ": kernel minus its value at distance 0 (logit units; columns: distance key - query)");
  }

  // ---- the power-method view (seed 002): reports/power.py ---------------------------------------------------
  var KINDS = ["resid_pre", "resid_mid", "resid_post"];
  function alignment(parent, doc) {  // alignment_document: a chart per kind of point, then per token
    KINDS.forEach(function (kind) {
      var sel = where(doc.points, function (p) { return p.endsWith("." + kind); });
      if (!sel.length) return;
      plot(parent, "lines", {x: sel.map(function (i) { return String(doc.layer_of[i]); }), xlabel: "layer",
        series: curves(doc, sel), width: 720, height: 320}, "at " + kind);
    });
    if (!doc.per_token || !doc.per_token.length || !doc.tokens || !doc.tokens.length) return;
    var post = where(doc.points, function (p) { return p.endsWith(".resid_post"); }), z = doc.per_token[0];
    var rows = doc.tokens[0].map(function (t, j) { return post.map(function (i) { return z[i][j]; }); });
    plot(parent, "heatmap", {z: rows, row_labels: doc.tokens[0], vmin: 0,
      col_labels: post.map(function (i) { return "L" + doc.layer_of[i]; })}, "per token (first text), at each layer's output");
  }
  function modulus(c) { return c ? Math.hypot(c[0], c[1]) : null; }  // a complex number is [re, im]
  function spectra(parent, doc) {  // spectra_document: per layer a row, the leading moduli, the heads' |lambda1|
    var L = doc.layers;
    table(parent, ["layer", "|λ1|", "λ1", "gap |λ2/λ1|", "gap of I+F", "nearest tokens to +v1", "nearest to -v1"],
      L.map(function (s) {
        var l1 = s.eigenvalues[0] || [0, 0];
        return [s.layer, modulus(l1), s.complex_pair ? fmt(l1[0]) + (l1[1] < 0 ? "" : "+") + fmt(l1[1]) + "i" :
                fmt(l1[0]), s.gap, s.residual_gap, s.nearest.slice(0, 6).map(quote).join(" "),
                s.opposite.slice(0, 4).map(quote).join(" ")];
      }));
    plot(parent, "lines", {x: L.map(function (s) { return "L" + s.layer; }), xlabel: "layer", width: 720, height: 320,
      series: [{name: "|λ1|", y: L.map(function (s) { return modulus(s.eigenvalues[0]); })},
               {name: "|λ2|", y: L.map(function (s) { return modulus(s.eigenvalues[1]); }), dash: true},
               {name: "gap |λ2/λ1|", y: L.map(function (s) { return s.gap; })}]},
      "leading eigenvalues and gap per layer");
    if (!L.some(function (s) { return s.heads && s.heads.length; })) return;
    var heads = L.map(function (s) { return s.heads.map(function (h) { return modulus(h.eigenvalues[0]); }); });
    plot(parent, "heatmap", {z: heads, row_labels: L.map(function (s) { return "L" + s.layer; }),
      col_labels: L[0].heads.map(function (h) { return "h" + h.head; })}, "|λ1| of each head's W_v,h W_o,h");
  }
  function dynamics(parent, doc) {  // dynamics_document: every mode against the random baseline, and the real one
    var x = doc.layers.map(String);
    plot(parent, "lines", {x: x, xlabel: "layer", width: 720, height: 320, series: doc.modes.map(function (m) {
      return {name: m, y: doc.alignment[m]}; }).concat([{name: "random", y: doc.layers.map(function () {
        return doc.random_mean; }), dash: true}])}, "mean |cos(x, v1(F_l))| at each layer's output");
    plot(parent, "lines", {x: x, xlabel: "layer", width: 720, height: 320, series: doc.modes.filter(function (m) {
      return m !== "real"; }).map(function (m) { return {name: m, y: doc.agreement[m]}; })},
      "agreement with the real trajectory: mean cos(x_mode, x_real)");
  }
  function sharedWeights(parent, doc) {  // shared_document: its curves against depth 0..n_layers
    var x = range(doc.n_layers + 1);
    plot(parent, "lines", {x: x.map(String), xlabel: "depth l", series: curves(doc, x), width: 720, height: 320},
      "mean |cos(x_l, v1(F_k))| against depth");
  }

  // ---- steering (seed 002): reports/steer.py -------------------------------------------------------------------
  function steering(parent, doc) {  // the document of a SteeringSweep: one row per run
    return table(parent, ["method", "layers", "alpha", "prompt", "greedy continuation", "p(target)", "rank (0 = top)",
                          "top next token", "perplexity", "push along u"], doc.rows.map(function (r) {
      return [r.method, r.layers.join(","), r.alpha, r.prompt, r.text, r.target_prob, r.target_rank,
              show(r.top_token), r.perplexity, r.push];
    }));
  }

  // ---- a report's parts as data (reports/steercard.py Parts: the steering card in the explorer) ---------------
  function parts(parent, list) {  // [{part: h2|p|table|lines, ...}]: headings, notes, tables, charts; text only
    list.forEach(function (q) {
      if (q.part === "h2") el(parent, "h2", {}, q.text);
      else if (q.part === "p") el(parent, "p", q.note ? {"class": "note"} : {}, q.text);
      else if (q.part === "table") table(parent, q.headers, q.rows);
      else if (q.part === "lines") plot(parent, "lines", q.spec, q.title);
    });
  }

  // ---- patching (docs/patching.md): reports/patching.py, the documents of PatchResult and WalkBeside ------------
  function g6(v) { return v === null || v === undefined ? "nan" : String(Number(Number(v).toPrecision(6))); }
  // a PatchResult's document: the grid as a heatmap (rows: the points, or path patching's receivers; columns: the
  // corrupted prompt's positions and tokens; hover: the raw metric), the two references, the parity card of
  // attribution patching, the notes; returns the heatmap's geometry
  function patching(parent, doc) {
    var path = doc.method === "path", sender = doc.sender || "the sender";
    var cols = doc.positions.map(function (p, j) { return p + " " + quote(doc.tokens[j]); });
    var hover = doc.raw.map(function (row, i) { return row.map(function (r, j) {
      return (path ? "receiver " + doc.points[i] + " of " + sender + "'s change at position " + doc.positions[j] +
        "\n" : "") + doc.metric + " = " + g6(r); }); });
    var geo = plot(parent, "heatmap", {z: doc.values, row_labels: doc.points, col_labels: cols, hover: hover,
      diverging: true, vmin: -1, vmax: 1, legend: "1 = the clean run, 0 = the corrupted run"}, path ?
      "path patching from " + sender + ", " + doc.direction + ": rows the receivers, columns the position of " +
      sender + "'s change" : doc.method + " patching, " + doc.direction + ": rows the points, columns the positions");
    table(parent, ["reference", doc.metric], [["clean run", doc.clean_metric], ["corrupted run", doc.corrupted_metric]]);
    var c = doc.parity;
    if (c) {
      el(parent, "h2", {}, "Attribution patching against exact patching (the parity card)");
      var rows = [["all cells", c.spearman, c.topk_overlap, c.cells]];
      Object.keys(c.by_kind).forEach(function (k) {
        var v = c.by_kind[k];
        rows.push([k, v.spearman, v.topk_overlap, v.cells]);
      });
      table(parent, ["cells", "Spearman", "top-" + c.k + " overlap", "n"], rows);
      el(parent, "p", {"class": "note"}, "Attribution patching " + (c.agrees ? "agrees" : "DISAGREES") + " with " +
        "exact patching on the same cells (thresholds: Spearman >= " + fmt(c.min_spearman) + ", top-" + c.k +
        " overlap >= " + fmt(c.min_topk_overlap) + ").");
    }
    doc.notes.forEach(function (n) { el(parent, "p", {"class": "note"}, n); });
    return geo;
  }
  // a WalkBeside's document: per layer, restoring the clean residual entering it at the last position (clean 1,
  // corrupted 0) beside the answer's rank in the clean walk at that same vector, the first layer of each marked;
  // both per layer in a table; then the grid (patching); returns the grid's geometry
  function walkBeside(parent, doc) {
    var x = doc.layers.map(function (l) { return "L" + l; }), marks = [];
    var colours = ["#1f77b4", "#ff7f0e", "#9467bd"];  // one per reading of the walk: its curve and its mark
    var at = function (layer) { return doc.layers.indexOf(layer); };
    doc.levels.forEach(function (v) {
      if (v.layer !== null) marks.push({at: at(v.layer), name: "restored >= " + v.level + ": L" + v.layer,
                                        color: "#2ca02c"}); });
    doc.readings.forEach(function (r, k) {
      if (r.layer !== null && at(r.layer) >= 0) marks.push({at: at(r.layer), name: r.name + ": " + r.point,
                                                            color: colours[k % 3]}); });
    table(parent, ["for " + show(doc.answer), "from", "layer"], doc.readings.map(function (r) {
      return ["walk (" + r.name + "): top-1 and stays", r.point === null ? "never" : r.point, r.layer];
    }).concat(doc.levels.map(function (v) {
      return ["restoring the last position's residual >= " + v.level, v.layer === null ? "never" :
              "L" + v.layer + ".resid_pre", v.layer];
    })));
    plot(parent, "lines", {x: x, xlabel: "layer (the clean residual entering it, at the last position)", width: 760,
      height: 300, marks: marks, series: [{name: "restored", color: "#2ca02c", y: doc.restored, hover: doc.restored.map(function (v, i) {
        return x[i] + ": restored " + g6(v) + " (" + doc.metric + " = " + g6(doc.restored_raw[i]) + ")"; })}]},
      "restoring the clean residual at the last position (1 = the clean run, 0 = the corrupted run)");
    plot(parent, "lines", {x: x, xlabel: "layer (the same vector in the clean run)", width: 760, height: 300,
      marks: marks, series: doc.readings.map(function (r, k) {
        return {name: r.name, color: colours[k % 3], y: r.ranks.map(rankZ), hover: r.ranks.map(function (k, i) {
          return x[i] + ", " + r.name + ": rank " + (k === null ? "-" : k); })}; })},
      "the answer's rank in the clean walk at each layer's input, log10(1 + rank): 0 = top-1");
    table(parent, ["layer", "restored", doc.metric].concat(doc.readings.map(function (r) {
      return "rank (" + r.name + ")"; })), doc.layers.map(function (l, i) {
      return [l, doc.restored[i], doc.restored_raw[i]].concat(doc.readings.map(function (r) { return r.ranks[i]; }));
    }));
    el(parent, "h3", {}, "the grid: the residual entering every layer, at every position");
    return patching(parent, doc.patch);
  }

  var draw = {alignment: alignment, spectra: spectra, dynamics: dynamics, shared_weights: sharedWeights,
              steering: steering, parts: parts, rank_map: rankMaps, self_mass: selfMass, head_stats: headStats,
              kernel_stack: kernelStack, simmap_view: similarityMaps, patching: patching, walk_beside: walkBeside};
  window.walklensResults = {draw: draw, rankMap: rankMap, selfMass: selfMass, headStats: headStats,
                            kernelStack: kernelStack, show: show, quote: quote, visible: visible, fmt: fmt,
                            table: table};
  function render() {  // the documents a report embeds: <div class='wl-result' data-result=kind data-doc=json>
    document.querySelectorAll(".wl-result:not([data-drawn])").forEach(function (e) {
      var f = draw[e.getAttribute("data-result")];
      if (!f) return;
      f(e, JSON.parse(e.getAttribute("data-doc")));
      e.setAttribute("data-drawn", "1");
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", render); else render();
})();
