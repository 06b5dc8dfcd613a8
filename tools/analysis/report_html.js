// The HTML report's script (embedded by report_html.cpp; no library, no network). It draws, from the
// JSON in #report-data: the timeline of live memory (stacked by backend or by site, device memory
// above the axis and host/managed memory below it, failures/out-of-memory/migrations as marks, hover
// for the stack, drag or wheel to zoom), the zoomable flame graph, and selection of a site from the
// table, the timeline or the flame graph.
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('report-data').textContent);
  var COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1',
                '#ff9da7', '#9c755f', '#86bcb6', '#d37295', '#a0cbe8'];
  var OTHER = '#c8c8c8';
  var MAX_SITE_LAYERS = 12;
  var selected = -1;  // site index

  function bytes(b) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    b = Math.abs(b);
    while (b >= 1024 && i < 4) { b /= 1024; i++; }
    return (i ? b.toFixed(b < 10 ? 2 : 1) : b) + ' ' + u[i];
  }
  function ns(t) {
    if (t < 1e3) return t + ' ns';
    if (t < 1e6) return (t / 1e3).toFixed(1) + ' us';
    if (t < 1e9) return (t / 1e6).toFixed(1) + ' ms';
    return (t / 1e9).toFixed(2) + ' s';
  }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  }
  // A step for about `n` ticks over `span`: 1-2-5 times a power of ten, or for bytes a power of
  // two (256 MiB, 512 MiB, 1 GiB: round in the unit the labels use).
  function niceStep(span, n, binary) {
    var raw = Math.max(span / n, 1);
    if (binary) return Math.pow(2, Math.ceil(Math.log2(raw)));
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var m = raw / p;
    return p * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10);
  }

  // ---- Step functions: sorted [t, value] points, the value holds until the next point. ----
  function valueAt(points, t) {
    var lo = 0, hi = points.length - 1, v = 0;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (points[mid][0] <= t) { v = points[mid][1]; lo = mid + 1; } else hi = mid - 1;
    }
    return v;
  }
  // The total live bytes over every series, as one step function.
  function totalOf(series) {
    var changes = [];
    series.forEach(function (s, i) {
      var prev = 0;
      s.points.forEach(function (p) { changes.push([p[0], p[1] - prev]); prev = p[1]; });
    });
    changes.sort(function (a, b) { return a[0] - b[0]; });
    var out = [], v = 0;
    changes.forEach(function (c) {
      v += c[1];
      if (out.length && out[out.length - 1][0] === c[0]) out[out.length - 1][1] = v;
      else out.push([c[0], v]);
    });
    return out;
  }

  // ---- Layers of the timeline ----
  // A layer: {name, color, points (step function), below (host side), site (index or -1)}.
  function backendLayers() {
    var multi = data.processes.length > 1;
    return data.series.map(function (s, i) {
      var name = (multi ? 'pid ' + s.pid + ' ' : '') + 'device ' + s.device + ' ' + s.backend +
                 (s.placement !== 'device' ? ' (' + s.placement + ' memory)' : '');
      return {name: name, color: COLORS[i % COLORS.length], points: s.points,
              below: s.placement !== 'device', site: -1};
    });
  }
  // Per site from the kept allocations; the largest sites by peak live bytes get a layer each,
  // the others share one, and what the kept allocations do not cover (when the trace had more than
  // the report keeps) is the series total minus them.
  function siteLayers() {
    var bySite = {};
    data.allocations.forEach(function (a) {
      var key = a[3] + (data.series[a[4]].placement !== 'device' ? ':h' : ':d');
      (bySite[key] = bySite[key] || []).push(a);
    });
    var layers = [];
    Object.keys(bySite).forEach(function (key) {
      var ch = [];
      bySite[key].forEach(function (a) {
        ch.push([a[0], a[2]]);
        if (a[1] >= 0) ch.push([a[1], -a[2]]);
      });
      ch.sort(function (x, y) { return x[0] - y[0] || x[1] - y[1]; });
      var pts = [], v = 0, peak = 0;
      ch.forEach(function (c) {
        v += c[1];
        peak = Math.max(peak, v);
        if (pts.length && pts[pts.length - 1][0] === c[0]) pts[pts.length - 1][1] = v;
        else pts.push([c[0], v]);
      });
      var site = +key.split(':')[0];
      layers.push({site: site, below: key.endsWith(':h'), points: pts, peak: peak});
    });
    layers.sort(function (x, y) { return y.peak - x.peak || x.site - y.site; });
    var shown = [], rest = {d: [], h: []};
    layers.forEach(function (l) {
      if (shown.length < MAX_SITE_LAYERS || l.site === selected) shown.push(l);
      else rest[l.below ? 'h' : 'd'].push(l);
    });
    var colorOf = {};
    shown.forEach(function (l) {
      if (!(l.site in colorOf)) colorOf[l.site] = COLORS[Object.keys(colorOf).length % COLORS.length];
      var s = data.sites[l.site];
      l.name = l.site < 0 ? '[stack not sampled]' : (s.frames[0] || '[no stack]');
      l.color = colorOf[l.site];
    });
    ['d', 'h'].forEach(function (side) {
      if (!rest[side].length) return;
      var merged = totalOf(rest[side]);
      shown.push({name: 'other sites', color: OTHER, points: merged, below: side === 'h', site: -1});
    });
    if (data.allocations_omitted > 0) {
      // The series count every allocation: the difference is the allocations not kept.
      ['d', 'h'].forEach(function (side) {
        var below = side === 'h';
        var total = totalOf(data.series.filter(function (s) { return (s.placement !== 'device') === below; }));
        var kept = totalOf(layers.filter(function (l) { return l.below === below; }));
        var pts = total.map(function (p) { return [p[0], Math.max(0, p[1] - valueAt(kept, p[0]))]; });
        if (pts.some(function (p) { return p[1] > 0; }))
          shown.push({name: 'allocations not kept individually', color: '#e8e8e8', points: pts,
                      below: below, site: -1});
      });
    }
    return shown;
  }

  // ---- The timeline ----
  // The address's fragment can choose the view and point at the timeline (for links, and for the
  // headless browser test): #site, #hover=X,Y (X pixels right of the plot's left edge, Y pixels
  // above the zero line).
  var hash = location.hash.slice(1).split('&');
  var T = {mode: hash.indexOf('site') >= 0 ? 'site' : 'backend', t0: 0, t1: Math.max(data.duration_ns, 1), layers: [], cols: []};
  var total = data.total;  // the envelope: exact where the series' own maxima, summed, are not
  var canvas = document.getElementById('timeline-canvas');
  var tip = document.getElementById('tooltip');
  var PAD_L = 78, PAD_R = 12, PAD_T = 10, AXIS = 22;
  var hostMemory = data.series.some(function (s) { return s.placement !== 'device'; });

  function layout() {
    var w = canvas.parentNode.clientWidth || 900;
    var h = hostMemory ? 380 : 300;
    var dpr = window.devicePixelRatio || 1;
    canvas.width = w * dpr; canvas.height = h * dpr;
    canvas.style.width = w + 'px'; canvas.style.height = h + 'px';
    return {w: w, h: h, dpr: dpr};
  }

  // For each pixel column, the moment of the highest total in it: every layer is read at that
  // moment, so the stack is a state the program was in and the peak shows at its true height.
  function columns(width) {
    var n = Math.max(1, Math.floor(width)), span = T.t1 - T.t0, cols = [];
    var i = 0;
    while (i < total.length && total[i][0] <= T.t0) i++;
    var cur = i > 0 ? total[i - 1][1] : 0;
    for (var c = 0; c < n; c++) {
      var a = T.t0 + span * c / n, b = T.t0 + span * (c + 1) / n;
      var best = a, bestV = cur;
      while (i < total.length && total[i][0] < b) {
        cur = total[i][1];
        if (cur > bestV) { bestV = cur; best = total[i][0]; }
        i++;
      }
      cols.push(best);
    }
    return cols;
  }

  function drawTimeline() {
    var L = layout(), ctx = canvas.getContext('2d');
    ctx.setTransform(L.dpr, 0, 0, L.dpr, 0, 0);
    ctx.clearRect(0, 0, L.w, L.h);
    T.layers = T.mode === 'site' ? siteLayers() : backendLayers();
    var plotW = L.w - PAD_L - PAD_R;
    T.cols = columns(plotW);
    // Stacked values per column. Where the trace has more changes than the page keeps points, each
    // layer holds its highest level in that stretch: scaled so that the stack is the total's.
    var up = 0, down = 0, stacks = T.layers.map(function () { return []; });
    T.cols.forEach(function (t, c) {
      var vals = T.layers.map(function (l) { return valueAt(l.points, t); });
      var sum = vals.reduce(function (x, y) { return x + y; }, 0), tot = valueAt(total, t);
      var f = sum > tot && sum > 0 ? tot / sum : 1;
      var u = 0, d = 0;
      T.layers.forEach(function (l, k) {
        var v = vals[k] * f;
        if (l.below) { stacks[k].push([d, d + v]); d += v; } else { stacks[k].push([u, u + v]); u += v; }
      });
      up = Math.max(up, u); down = Math.max(down, d);
    });
    up = Math.max(up, 1) * 1.08;  // room for the peak's label
    var plotH = L.h - PAD_T - AXIS;
    var upH = hostMemory ? plotH * up / (up + Math.max(down, up * 0.25)) : plotH;
    var zeroY = PAD_T + upH;
    var scale = upH / up;
    T.geom = {zeroY: zeroY, scale: scale, plotW: plotW};
    T.stacks = stacks;
    // Layers: each column is a 1-pixel-wide bar (exact for step functions at any zoom).
    T.layers.forEach(function (l, k) {
      ctx.fillStyle = l.color;
      ctx.globalAlpha = selected >= 0 && l.site !== selected && T.mode === 'site' ? 0.35 : 1;
      ctx.beginPath();
      stacks[k].forEach(function (s, c) {
        if (s[1] === s[0]) return;
        var y0 = l.below ? zeroY + s[0] * scale : zeroY - s[1] * scale;
        ctx.rect(PAD_L + c, y0, 1.02, (s[1] - s[0]) * scale);
      });
      ctx.fill();
    });
    ctx.globalAlpha = 1;
    // Axes and ticks.
    ctx.strokeStyle = '#888'; ctx.fillStyle = '#444'; ctx.font = '11px sans-serif';
    ctx.beginPath(); ctx.moveTo(PAD_L, zeroY); ctx.lineTo(PAD_L + plotW, zeroY);
    ctx.moveTo(PAD_L, PAD_T); ctx.lineTo(PAD_L, L.h - AXIS); ctx.stroke();
    var yStep = niceStep(up, 7, true);
    ctx.textAlign = 'right';
    for (var v = 0; v <= up * 1.0001; v += yStep) {
      var y = zeroY - v * scale;
      ctx.fillText(bytes(v), PAD_L - 6, y + 4);
      if (v > 0) { ctx.strokeStyle = '#eee'; ctx.beginPath(); ctx.moveTo(PAD_L + 1, y); ctx.lineTo(PAD_L + plotW, y); ctx.stroke(); }
    }
    if (hostMemory) {
      var downMax = (L.h - AXIS - zeroY) / scale;
      for (var w = yStep; w <= downMax; w += yStep) ctx.fillText(bytes(w), PAD_L - 6, zeroY + w * scale + 4);
      ctx.save(); ctx.fillStyle = '#777'; ctx.textAlign = 'left';
      ctx.fillText('device \u2191', PAD_L + 4, zeroY - 4);
      ctx.fillText('host / managed \u2193', PAD_L + 4, zeroY + 12);
      ctx.restore();
    }
    var span = T.t1 - T.t0, tStep = niceStep(span, Math.max(2, plotW / 110), false);
    ctx.textAlign = 'center'; ctx.fillStyle = '#444';
    for (var t = Math.ceil(T.t0 / tStep) * tStep; t <= T.t1; t += tStep) {
      var x = PAD_L + (t - T.t0) / span * plotW;
      ctx.strokeStyle = '#888'; ctx.beginPath(); ctx.moveTo(x, L.h - AXIS); ctx.lineTo(x, L.h - AXIS + 4); ctx.stroke();
      if (x < L.w - 24) ctx.fillText(ns(Math.round(t)), x, L.h - 6);
    }
    // The peak the summary states (all processes, devices and host memory together), where it happened.
    if (data.peak_live > 0 && data.peak_ns >= T.t0 && data.peak_ns <= T.t1) {
      var px = PAD_L + (data.peak_ns - T.t0) / span * plotW, right = px > L.w - 200;
      ctx.strokeStyle = '#c00'; ctx.setLineDash([4, 3]);
      ctx.beginPath(); ctx.moveTo(px, PAD_T); ctx.lineTo(px, L.h - AXIS); ctx.stroke();
      ctx.setLineDash([]); ctx.fillStyle = '#c00'; ctx.textAlign = right ? 'right' : 'left';
      ctx.fillText('peak ' + data.peak_text, px + (right ? -4 : 4), PAD_T + 10);
    }
    // Failures, out-of-memory, migrations, reloads: marks on the time axis.
    T.marks = [];
    data.events.forEach(function (e) {
      if (e[0] < T.t0 || e[0] > T.t1) return;
      var x = PAD_L + (e[0] - T.t0) / span * plotW;
      ctx.fillStyle = e[1] === 'migration' ? '#2a7' : e[1] === 'policy reload' ? '#777' : '#d00';
      ctx.beginPath(); ctx.moveTo(x, L.h - AXIS); ctx.lineTo(x - 4, L.h - AXIS + 7); ctx.lineTo(x + 4, L.h - AXIS + 7); ctx.fill();
      T.marks.push({x: x, e: e});
    });
    legend();
    // What was drawn, for the headless browser test.
    canvas.setAttribute('data-layers', T.layers.length);
    canvas.setAttribute('data-columns', T.cols.length);
    canvas.setAttribute('data-marks', T.marks.length);
    document.getElementById('zoom-state').textContent =
      T.t0 > 0 || T.t1 < data.duration_ns ? 'showing ' + ns(Math.round(T.t0)) + ' \u2013 ' + ns(Math.round(T.t1)) + ' (double-click: all)' : '';
  }

  function legend() {
    var box = document.getElementById('timeline-legend');
    box.textContent = '';
    T.layers.forEach(function (l) {
      var item = el('span', {'class': 'legend-item' + (l.site >= 0 ? ' clickable' : '')});
      var sw = el('span', {'class': 'swatch'});
      sw.style.background = l.color;
      item.appendChild(sw);
      item.appendChild(document.createTextNode(l.name + (l.below && T.mode === 'site' ? ' (host)' : '')));
      if (l.site >= 0) item.addEventListener('click', function () { select(l.site); });
      box.appendChild(item);
    });
  }

  function hit(ev) {
    var r = canvas.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
    var c = Math.floor(x - PAD_L);
    if (c < 0 || c >= T.cols.length) return null;
    for (var m = 0; m < (T.marks || []).length; m++)
      if (Math.abs(T.marks[m].x - x) <= 5 && y > T.geom.zeroY && y >= canvas.clientHeight - AXIS - 2) return {mark: T.marks[m].e};
    var g = T.geom;
    for (var k = 0; k < T.layers.length; k++) {
      var s = T.stacks[k][c], l = T.layers[k];
      var top = l.below ? g.zeroY + s[0] * g.scale : g.zeroY - s[1] * g.scale;
      var bottom = l.below ? g.zeroY + s[1] * g.scale : g.zeroY - s[0] * g.scale;
      if (y >= top - 0.5 && y <= bottom + 0.5 && s[1] > s[0]) return {layer: l, t: T.cols[c], v: s[1] - s[0]};
    }
    return {t: T.cols[c]};
  }

  function showTip(ev, lines) {
    tip.textContent = lines.join('\n');
    tip.style.display = 'block';
    tip.style.left = Math.min(ev.pageX + 14, document.body.scrollWidth - tip.offsetWidth - 10) + 'px';
    tip.style.top = ev.pageY + 14 + 'px';
  }
  function stackLines(site, n) {
    if (site < 0) return [];
    var f = data.sites[site].frames;
    var out = f.slice(0, n).map(function (x, i) { return (i ? '  by ' : '  at ') + x; });
    if (f.length > n) out.push('  ... ' + (f.length - n) + ' more frames');
    return out;
  }

  var drag = null;
  canvas.addEventListener('mousemove', function (ev) {
    if (drag) {
      var r = canvas.getBoundingClientRect();
      drag.x1 = ev.clientX - r.left;
      var sel = document.getElementById('zoom-box');
      sel.style.display = 'block';
      sel.style.left = canvas.offsetLeft + Math.min(drag.x0, drag.x1) + 'px';
      sel.style.width = Math.abs(drag.x1 - drag.x0) + 'px';
      sel.style.top = canvas.offsetTop + 'px';
      sel.style.height = canvas.clientHeight - AXIS + 'px';
      return;
    }
    var h = hit(ev);
    if (!h) { tip.style.display = 'none'; return; }
    if (h.mark) {
      var e = h.mark;
      showTip(ev, [e[1] + ' at ' + ns(e[0]), 'pid ' + e[2] + ', device ' + e[3] + ', ' + bytes(e[4])]);
    } else if (h.layer) {
      var lines = [h.layer.name + (h.layer.below ? ' (host side)' : ''), bytes(h.v) + ' live at ' + ns(h.t) +
                   ' (total ' + bytes(valueAt(total, h.t)) + ')'];
      showTip(ev, lines.concat(stackLines(h.layer.site, 12)));
    } else {
      showTip(ev, [ns(h.t) + ': ' + bytes(valueAt(total, h.t)) + ' live']);
    }
  });
  canvas.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
  canvas.addEventListener('mousedown', function (ev) {
    var r = canvas.getBoundingClientRect();
    drag = {x0: ev.clientX - r.left, x1: ev.clientX - r.left};
  });
  function xToT(x) { return T.t0 + (x - PAD_L) / T.geom.plotW * (T.t1 - T.t0); }
  window.addEventListener('mouseup', function () {
    if (!drag) return;
    var d = drag;
    drag = null;
    document.getElementById('zoom-box').style.display = 'none';
    if (Math.abs(d.x1 - d.x0) < 4) {  // a click: select the site under the cursor
      return;
    }
    var a = Math.max(T.t0, xToT(Math.min(d.x0, d.x1))), b = Math.min(T.t1, xToT(Math.max(d.x0, d.x1)));
    if (b - a >= 1) { T.t0 = a; T.t1 = b; drawTimeline(); }
  });
  canvas.addEventListener('click', function (ev) {
    var h = hit(ev);
    if (h && h.layer && h.layer.site >= 0) select(h.layer.site);
  });
  canvas.addEventListener('wheel', function (ev) {
    ev.preventDefault();
    var r = canvas.getBoundingClientRect(), t = xToT(ev.clientX - r.left);
    var f = ev.deltaY < 0 ? 0.8 : 1.25, full = Math.max(data.duration_ns, 1);
    var a = t - (t - T.t0) * f, b = t + (T.t1 - t) * f;
    T.t0 = Math.max(0, a); T.t1 = Math.min(full, b);
    if (T.t1 - T.t0 < 1) T.t1 = T.t0 + 1;
    drawTimeline();
  }, {passive: false});
  canvas.addEventListener('dblclick', function () { T.t0 = 0; T.t1 = Math.max(data.duration_ns, 1); drawTimeline(); });
  document.querySelectorAll('input[name="stack-by"]').forEach(function (r) {
    r.addEventListener('change', function () { T.mode = r.value; drawTimeline(); });
  });

  // ---- The flame graph ----
  var F = {root: null, focus: null};
  function buildFlame() {
    var root = {name: 'all', value: 0, children: {}, sites: []};
    data.sites.forEach(function (s, i) {
      var v = s.weight;
      if (!v) return;
      root.value += v;
      var n = root, frames = s.frames.length ? s.frames.slice().reverse() : ['[no stack]'];
      frames.forEach(function (f) {
        var c = n.children[f] || (n.children[f] = {name: f, value: 0, children: {}, parent: n, sites: []});
        c.value += v;
        n = c;
      });
      n.sites.push(i);
    });
    return root;
  }
  function onPath(node, site) {
    if (site < 0) return false;
    var f = data.sites[site].frames, n = node, names = [];
    while (n && n.parent) { names.push(n.name); n = n.parent; }
    names.reverse();
    var rootFirst = f.slice().reverse();
    for (var i = 0; i < names.length; i++) if (rootFirst[i] !== names[i]) return false;
    return true;
  }
  function drawFlame() {
    var box = document.getElementById('flame');
    box.textContent = '';
    var W = box.clientWidth || 1000, ROW = 18, focus = F.focus || F.root;
    if (!F.root.value) { box.appendChild(el('p', {}, 'No allocations with a weight for this metric.')); return; }
    var rows = [], depthMax = 0;
    // Ancestors of the focus span the whole width; the focus's subtree is scaled to it.
    var chain = [], n = focus;
    while (n) { chain.unshift(n); n = n.parent; }
    chain.forEach(function (c, d) { rows.push({node: c, x: 0, w: W, depth: d, ancestor: c !== focus}); });
    (function walk(node, x, depth) {
      var cx = x;
      Object.keys(node.children).sort().forEach(function (k) {
        var c = node.children[k], w = c.value / focus.value * W;
        if (w >= 0.5) { rows.push({node: c, x: cx, w: w, depth: depth}); depthMax = Math.max(depthMax, depth); walk(c, cx, depth + 1); }
        cx += w;
      });
    })(focus, 0, chain.length);
    depthMax = Math.max(depthMax, chain.length - 1);
    var s = svg('svg', {width: W, height: (depthMax + 1) * ROW, id: 'flame-svg'});
    rows.forEach(function (r) {
      var g = svg('g', {'class': 'frame' + (r.ancestor ? ' ancestor' : '') + (onPath(r.node, selected) ? ' on-path' : '')});
      var h = 0;
      for (var i = 0; i < r.node.name.length; i++) h = (h * 31 + r.node.name.charCodeAt(i)) | 0;
      h = Math.abs(h);
      var rect = svg('rect', {x: r.x, y: r.depth * ROW, width: Math.max(r.w - 0.5, 0.5), height: ROW - 1,
                              fill: r.node === F.root ? '#ddd' : 'hsl(' + (10 + h % 45) + ',75%,' + (58 + (h >> 8) % 14) + '%)'});
      g.appendChild(rect);
      if (r.w > 30) {
        var t = svg('text', {x: r.x + 3, y: r.depth * ROW + 13});
        t.textContent = r.node.name.length * 6.6 > r.w - 6 ? r.node.name.slice(0, Math.max(0, Math.floor((r.w - 6) / 6.6) - 1)) + '\u2026' : r.node.name;
        g.appendChild(t);
      }
      g.addEventListener('click', function () {
        F.focus = r.node === focus && r.node.parent ? r.node.parent : r.node;
        if (r.node.sites.length === 1) select(r.node.sites[0], true); else drawFlame();
      });
      g.addEventListener('mousemove', function (ev) {
        var pct = (100 * r.node.value / F.root.value).toFixed(1);
        showTip(ev, [r.node.name, data.weight_format === 'bytes' ? bytes(r.node.value) + ' (' + pct + '%)'
                                                                  : r.node.value + ' ' + data.metric + ' (' + pct + '%)',
                     'click: zoom' + (r.node === focus ? ' out' : ' in')]);
      });
      g.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
      s.appendChild(g);
    });
    box.appendChild(s);
  }

  // ---- Sites: the table, selection and the detail panel ----
  function select(site, keepFlameFocus) {
    selected = site;
    document.querySelectorAll('#sites tbody tr').forEach(function (tr) {
      tr.classList.toggle('selected', +tr.dataset.site === site);
    });
    var d = document.getElementById('site-detail');
    d.textContent = '';
    if (site >= 0) {
      var s = data.sites[site];
      d.appendChild(el('h3', {}, 'Site ' + (site + 1)));
      d.appendChild(el('p', {}, bytes(s.bytes) + ' in ' + s.calls + ' calls, ' + bytes(s.held_at_peak) +
                                ' held at the peak, ' + s.temporaries + ' temporary, ' + bytes(s.leaked_bytes) +
                                ' never freed' + (s.failures ? ', ' + s.failures + ' failed' : '')));
      d.appendChild(el('pre', {}, stackLines(site, 1000).join('\n')));
    }
    if (T.mode !== 'site' && site >= 0) {
      T.mode = 'site';
      document.querySelector('input[name="stack-by"][value="site"]').checked = true;
    }
    drawTimeline();
    if (!keepFlameFocus) F.focus = null;
    drawFlame();
  }
  document.querySelectorAll('#sites tbody tr').forEach(function (tr) {
    tr.addEventListener('click', function () { select(+tr.dataset.site); });
  });
  document.querySelectorAll('#sites th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      var body = document.querySelector('#sites tbody');
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) { return (+b.cells[col].dataset.v || 0) - (+a.cells[col].dataset.v || 0); });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });

  if (T.mode === 'site') document.querySelector('input[name="stack-by"][value="site"]').checked = true;
  F.root = buildFlame();
  drawTimeline();
  drawFlame();
  window.addEventListener('resize', function () { drawTimeline(); drawFlame(); });
  hash.forEach(function (h) {
    var m = /^hover=(\d+),(\d+)$/.exec(h);
    if (!m) return;
    var r = canvas.getBoundingClientRect();
    canvas.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + PAD_L + +m[1],
                                                     clientY: r.top + T.geom.zeroY - m[2], bubbles: true}));
  });
  document.body.setAttribute('data-ready', 'yes');
})();
