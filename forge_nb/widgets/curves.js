// The dashboard's live training curves, drawn on one canvas: the page half of forge_nb/widgets/curves.py.
//
// Why a canvas and not plotly: on a 2-core machine chromium spent ~120 ms redrawing the nine-panel plotly
// figure at every update, and plotly's FigureWidget answered each update with deltas that the kernel
// and the Jupyter server had to process: 40% of the training steps were lost with the dashboard on
// screen (bench/RESULTS.md). This view gets only the new points, never replies to an update, redraws
// at most once per redraw_interval (1 s), and only while it is on screen.
//
// Two hosts run this module: anywidget in JupyterLab (CurvesView), and panel's JSComponent in the panel
// app (PanelCurves, forge_nb/widgets/panel_app.py). `adapt` gives the second the first's model API;
// panel has no binary buffers, so there the float64 values come base64-encoded in msg.b64.
//
// Kernel -> page, one custom message per flush:
//   {type: "points", traces: [[index, start, count], ...], sync: bool} and one float64 buffer holding,
//   trace after trace, its `count` x values and then its `count` y values. start 0 replaces the trace's
//   points; any other start appends after the first `start` points. A view that holds a different
//   number of points (it opened late, or missed a message) asks for everything again.
// Page -> kernel: {type: "sync"}, when a view opens and after such a gap; nothing else.
// Synced traits (they change rarely): panels [{title, row, col, empty}], traces [{key, panel, kind, name,
// color, width, dash}], marks [[step, kind, label]], mark_styles {kind: {name, color, symbol, y}},
// height, redraw_interval (seconds). Tests and benchmarks read el.forgeCurves (points per trace,
// and stats: messages, draws, syncs, draw_ms, and the titles of the panels last drawn empty).

const FONT = "11px system-ui, -apple-system, 'Segoe UI', sans-serif";
const LEFT = 58, RIGHT = 14, TOP = 6, TITLE = 18, TICKS = 16, COL_GAP = 64;

function series() {
  return { x: new Float64Array(64), y: new Float64Array(64), n: 0 };
}

function append(s, xs, ys) {
  const need = s.n + xs.length;
  if (need > s.x.length) {
    let cap = s.x.length;
    while (cap < need) cap *= 2;
    const x = new Float64Array(cap), y = new Float64Array(cap);
    x.set(s.x.subarray(0, s.n));
    y.set(s.y.subarray(0, s.n));
    s.x = x;
    s.y = y;
  }
  s.x.set(xs, s.n);
  s.y.set(ys, s.n);
  s.n = need;
}

function adapt(model) {
  // panel's JSComponent model: attributes instead of get(), send_msg() instead of send(); its on/off
  // take anywidget's "change:<name>" and "msg:custom" names as they are.
  if (typeof model.send_msg !== "function") return model;
  return {
    get: name => model[name],
    send: content => model.send_msg(content),
    on: (event, cb) => model.on(event, cb),
    off: (event, cb) => model.off(event, cb),
  };
}

function decode(b64) {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  return new Float64Array(bytes.buffer);
}

function float64(view) {
  // A DataView into the websocket frame; its offset need not be 8-aligned, so copy the bytes out.
  const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength).slice();
  return new Float64Array(bytes.buffer);
}

function nearest(s, step) {
  // Index of the point whose x is closest to `step` (x ascends), or -1 for an empty series.
  if (s.n === 0) return -1;
  let lo = 0, hi = s.n - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (s.x[mid] < step) lo = mid + 1; else hi = mid;
  }
  return lo > 0 && Math.abs(s.x[lo - 1] - step) <= Math.abs(s.x[lo] - step) ? lo - 1 : lo;
}

function ticks(lo, hi, want) {
  const raw = (hi - lo) / want;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return out;
}

function fmt(v) {
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
  return String(Number(v.toPrecision(4)));
}

function boxes(panels, width, height) {
  // Plot rectangles: rows share the height (the first row 1.6x), a row with one panel spans both columns.
  const rows = Math.max(...panels.map(p => p.row));
  const weight = r => (r === 1 ? 1.6 : 1);
  let total = 0;
  for (let r = 1; r <= rows; r++) total += weight(r);
  const free = height - TOP - rows * (TITLE + TICKS);
  const top = [];
  let y = TOP;
  for (let r = 1; r <= rows; r++) {
    top[r] = [y + TITLE, (free * weight(r)) / total];
    y += TITLE + top[r][1] + TICKS;
  }
  const full = width - LEFT - RIGHT, half = (full - COL_GAP) / 2;
  return panels.map(p => {
    const alone = panels.filter(q => q.row === p.row).length === 1;
    const [py, ph] = top[p.row];
    return { x: alone ? LEFT : LEFT + (p.col - 1) * (half + COL_GAP), y: py, w: alone ? full : half, h: ph };
  });
}

function render({ model: host, el }) {
  const model = adapt(host);
  el.classList.add("forge-curves");
  const canvas = document.createElement("canvas");
  canvas.style.display = "block";
  canvas.style.width = "100%";
  // Its own compositing layer: a redraw then repaints the canvas alone, not the notebook tiles under it
  // (chromium without a GPU spent ~5 ms/s less per redraw a second in JupyterLab; bench/RESULTS.md).
  canvas.style.willChange = "transform";
  el.appendChild(canvas);
  const ctx = canvas.getContext("2d");
  const data = [];  // trace index -> series
  const stats = { messages: 0, draws: 0, syncs: 0, draw_ms: 0, empty: [] };
  let syncing = false, visible = true, stale = true, frame = 0, timer = 0, last = -Infinity, hover = null;

  const askSync = () => {
    if (syncing) return;
    syncing = true;
    stats.syncs++;
    model.send({ type: "sync" });
  };

  const schedule = urgent => {
    // New points are drawn at most once per redraw_interval; a hover, a resize or coming back into
    // view is drawn in the next frame.
    stale = true;
    if (!visible || frame) return;
    const wait = urgent === true ? 0 : last + 1000 * model.get("redraw_interval") - performance.now();
    if (wait <= 0) {
      clearTimeout(timer);
      timer = 0;
      frame = requestAnimationFrame(draw);
    } else if (!timer) {
      timer = setTimeout(() => { timer = 0; schedule(true); }, wait);
    }
  };

  const onMessage = (msg, buffers) => {
    if (msg.type !== "points") return;
    stats.messages++;
    if (msg.sync) syncing = false;
    const values = buffers && buffers.length ? float64(buffers[0]) : decode(msg.b64 || "");
    let at = 0, gap = false;
    for (const [i, start, count] of msg.traces) {
      const xs = values.subarray(at, at + count), ys = values.subarray(at + count, at + 2 * count);
      at += 2 * count;
      const s = (data[i] ||= series());
      if (start === 0) s.n = 0;
      else if (s.n !== start) { gap = true; continue; }
      append(s, xs, ys);
    }
    if (gap) askSync();
    schedule();
  };

  function draw() {
    frame = 0;
    if (!visible) return;
    stale = false;
    stats.draws++;
    last = performance.now();
    const width = el.clientWidth || 800, height = model.get("height");
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(height * dpr);
      canvas.style.height = height + "px";
    }
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = FONT;
    const panels = model.get("panels"), traces = model.get("traces");
    const marks = model.get("marks"), styles = model.get("mark_styles");
    const rects = boxes(panels, width, height);
    let xlo = Infinity, xhi = -Infinity;
    for (const s of data) if (s && s.n) { xlo = Math.min(xlo, s.x[0]); xhi = Math.max(xhi, s.x[s.n - 1]); }
    if (!(xhi > xlo)) { xlo = Number.isFinite(xlo) ? xlo - 1 : 0; xhi = Number.isFinite(xhi) ? xhi + 1 : 1; }
    stats.empty = [];
    panels.forEach((p, k) => drawPanel(p, k, rects[k], traces, marks, styles, xlo, xhi));
    stats.draw_ms += performance.now() - last;
  }

  function drawPanel(panel, k, r, traces, marks, styles, xlo, xhi) {
    const mine = traces.map((t, i) => [t, data[i]]).filter(([t, s]) => t.panel === k && s && s.n);
    let ylo = Infinity, yhi = -Infinity;
    for (const [, s] of mine) for (let j = 0; j < s.n; j++) {
      const v = s.y[j];
      if (v < ylo) ylo = v;
      if (v > yhi) yhi = v;
    }
    if (!(yhi >= ylo)) { ylo = 0; yhi = 1; }
    const pad = yhi > ylo ? 0.06 * (yhi - ylo) : Math.abs(yhi) * 0.1 || 1;
    ylo -= pad; yhi += pad;
    const sx = v => r.x + ((v - xlo) / (xhi - xlo)) * r.w;
    const sy = v => r.y + r.h - ((v - ylo) / (yhi - ylo)) * r.h;

    ctx.fillStyle = "#f4f6fa";
    ctx.fillRect(r.x, r.y, r.w, r.h);
    ctx.strokeStyle = "#dde3ec";
    ctx.lineWidth = 1;
    ctx.fillStyle = "#555";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const v of ticks(ylo, yhi, Math.max(2, Math.round(r.h / 40)))) {
      const y = Math.round(sy(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(r.x, y); ctx.lineTo(r.x + r.w, y); ctx.stroke();
      ctx.fillText(fmt(v), r.x - 5, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (const v of ticks(xlo, xhi, Math.max(2, Math.round(r.w / 90)))) {
      const x = Math.round(sx(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, r.y); ctx.lineTo(x, r.y + r.h); ctx.stroke();
      ctx.fillText(fmt(v), x, r.y + r.h + 3);
    }
    ctx.textAlign = "left";
    ctx.textBaseline = "bottom";
    ctx.fillStyle = "#222";
    ctx.font = "bold " + FONT;
    ctx.fillText(panel.title, r.x, r.y - 3);
    ctx.font = FONT;
    legend(r, mine.map(([t]) => t).filter(t => t.kind === "line"));

    ctx.save();
    ctx.beginPath();
    ctx.rect(r.x, r.y, r.w, r.h);
    ctx.clip();
    ctx.setLineDash([2, 3]);
    for (const [step, kind] of marks) {
      const x = Math.round(sx(step)) + 0.5;
      ctx.strokeStyle = styles[kind].color;
      ctx.beginPath(); ctx.moveTo(x, r.y); ctx.lineTo(x, r.y + r.h); ctx.stroke();
    }
    ctx.setLineDash([]);
    if (!mine.length && panel.empty) {
      stats.empty.push(panel.title);
      ctx.fillStyle = "#8a94a6";
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      ctx.fillText(panel.empty, r.x + r.w / 2, r.y + r.h / 2);
      ctx.textAlign = "left";
    }
    const upper = mine.find(([t]) => t.kind === "upper"), lower = mine.find(([t]) => t.kind === "lower");
    if (upper && lower) band(upper[1], lower[1], lower[0].color, sx, sy);
    for (const [t, s] of mine) if (t.kind === "line") line(t, s, sx, sy);
    if (k === 0) for (const [step, kind] of marks) symbol(styles[kind], sx(step), r.y + (1 - styles[kind].y) * r.h);
    if (hover && hover.x >= r.x && hover.x <= r.x + r.w && hover.y >= r.y && hover.y <= r.y + r.h) {
      readout(r, mine, k === 0 ? marks : [], sx, xlo + ((hover.x - r.x) / r.w) * (xhi - xlo));
    }
    ctx.restore();
  }

  function legend(r, lines) {
    if (lines.length < 2) return;
    ctx.textAlign = "right";
    let x = r.x + r.w;
    for (const t of [...lines].reverse()) {
      ctx.fillStyle = "#333";
      ctx.fillText(t.name, x, r.y - 3);
      x -= ctx.measureText(t.name).width + 4;
      ctx.fillStyle = t.color;
      ctx.fillRect(x - 12, r.y - 10, 12, 3);
      x -= 22;
    }
    ctx.textAlign = "left";
  }

  function line(t, s, sx, sy) {
    // The points that fall in one pixel column become at most two vertices, its lowest and highest in
    // the order they came: a long run costs two vertices per column, not one per point. Rasterizing
    // the segments is most of a redraw's cost, hence also the whole-pixel line widths.
    ctx.strokeStyle = t.color;
    ctx.lineWidth = t.width;
    ctx.setLineDash(t.dash ? [2, 3] : []);
    ctx.beginPath();
    let col = NaN, lo = 0, hi = 0, lowFirst = true, pen = false;
    const emit = () => {
      if (Number.isNaN(col)) return;
      const [a, b] = lowFirst ? [lo, hi] : [hi, lo];
      if (pen) ctx.lineTo(col, a); else ctx.moveTo(col, a);
      if (b !== a) ctx.lineTo(col, b);
      pen = true;
    };
    for (let j = 0; j < s.n; j++) {
      const v = s.y[j];
      if (!Number.isFinite(v)) { emit(); pen = false; col = NaN; continue; }
      const c = Math.round(sx(s.x[j])), py = sy(v);
      if (c === col) {
        if (py < lo) { lo = py; lowFirst = false; }
        if (py > hi) { hi = py; lowFirst = true; }
        continue;
      }
      emit();
      col = c; lo = hi = py; lowFirst = true;
    }
    emit();
    ctx.stroke();
    ctx.setLineDash([]);
  }

  function band(upper, lower, color, sx, sy) {
    // The min..max band, one top and one bottom vertex per pixel column.
    const n = Math.min(upper.n, lower.n);
    if (n < 2) return;
    const cols = [], tops = [], bottoms = [];
    for (let j = 0; j < n; j++) {
      const c = Math.round(sx(upper.x[j])), top = sy(upper.y[j]), bottom = sy(lower.y[j]);
      if (!Number.isFinite(top) || !Number.isFinite(bottom)) continue;
      const k = cols.length - 1;
      if (k >= 0 && cols[k] === c) {
        tops[k] = Math.min(tops[k], top);
        bottoms[k] = Math.max(bottoms[k], bottom);
      } else {
        cols.push(c); tops.push(top); bottoms.push(bottom);
      }
    }
    ctx.fillStyle = color;
    ctx.beginPath();
    for (let k = 0; k < cols.length; k++) ctx.lineTo(cols[k], tops[k]);
    for (let k = cols.length - 1; k >= 0; k--) ctx.lineTo(cols[k], bottoms[k]);
    ctx.closePath();
    ctx.fill();
  }

  function symbol(style, x, y) {
    ctx.strokeStyle = ctx.fillStyle = style.color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    if (style.symbol === "x") {
      ctx.moveTo(x - 4, y - 4); ctx.lineTo(x + 4, y + 4); ctx.moveTo(x + 4, y - 4); ctx.lineTo(x - 4, y + 4);
      ctx.stroke();
    } else {
      ctx.moveTo(x - 5, y - 4); ctx.lineTo(x + 5, y - 4); ctx.lineTo(x, y + 4); ctx.closePath();
      ctx.fill();
    }
  }

  function readout(r, mine, marks, sx, step) {
    // The hovered step: a rule, and a box with each line's value there and the marks at that step.
    const base = mine.find(([t]) => t.kind === "line");
    if (!base) return;
    const at = base[1].x[nearest(base[1], step)];
    const x = Math.round(sx(at)) + 0.5;
    ctx.strokeStyle = "#888";
    ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(x, r.y); ctx.lineTo(x, r.y + r.h); ctx.stroke();
    const rows = ["step " + fmt(at)];
    for (const [t, s] of mine) {
      if (t.kind !== "line") continue;
      const j = nearest(s, at);
      if (s.x[j] === at) rows.push(t.name + ": " + fmt(s.y[j]));
    }
    for (const [mstep, , label] of marks) if (Math.abs(sx(mstep) - x) < 5) rows.push(label);
    const w = Math.max(...rows.map(t => ctx.measureText(t).width)) + 12, h = rows.length * 15 + 8;
    const bx = x + 8 + w > r.x + r.w ? x - 8 - w : x + 8, by = r.y + 4;
    ctx.fillStyle = "rgba(255,255,255,0.92)";
    ctx.strokeStyle = "#bbb";
    ctx.fillRect(bx, by, w, h);
    ctx.strokeRect(bx + 0.5, by + 0.5, w, h);
    ctx.fillStyle = "#222";
    ctx.textBaseline = "top";
    rows.forEach((t, j) => ctx.fillText(t, bx + 6, by + 5 + j * 15));
  }

  const seen = new IntersectionObserver(entries => {
    visible = entries[entries.length - 1].isIntersecting;
    if (visible && stale) schedule(true);
  });
  seen.observe(el);
  const resized = new ResizeObserver(() => schedule(true));
  resized.observe(el);
  const moved = e => {
    const b = canvas.getBoundingClientRect();
    hover = { x: e.clientX - b.left, y: e.clientY - b.top };
    schedule(true);
  };
  const left = () => { hover = null; schedule(true); };
  canvas.addEventListener("mousemove", moved);
  canvas.addEventListener("mouseleave", left);
  const restyle = () => schedule(true);
  const STRUCTURE = ["change:traces", "change:marks", "change:panels", "change:height", "change:redraw_interval"];
  model.on("msg:custom", onMessage);
  for (const name of STRUCTURE) model.on(name, restyle);
  el.forgeCurves = {
    stats,
    points: key => {
      const i = model.get("traces").findIndex(t => t.key === key);
      return i >= 0 && data[i] ? data[i].n : 0;
    },
  };
  askSync();
  schedule(true);
  return () => {
    model.off("msg:custom", onMessage);
    for (const name of STRUCTURE) model.off(name, restyle);
    seen.disconnect();
    resized.disconnect();
    if (frame) cancelAnimationFrame(frame);
    clearTimeout(timer);
  };
}

export default { render };
