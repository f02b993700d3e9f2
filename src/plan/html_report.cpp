#include "plan/html_report.h"

#include <string_view>

#include "core/check.h"

namespace moecore::plan {

namespace {

// The ep values that divide the experts and a stage's ranks, each planned at the same world.
nlohmann::json ep_sweep(const Plan& p) {
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t ep = 1; ep <= p.layout.dp; ++ep) {
    if (p.layout.dp % ep != 0 || p.config.model.num_experts % ep != 0) continue;
    RunConfig c = p.config;
    c.parallel.ep = ep;
    Plan q;
    try {
      q = make_plan(c, p.layout.world, p.hardware);
    } catch (const Error&) {
      continue;  // e.g. a rowwise capacity the layout refuses
    }
    rows.push_back({{"ep", ep},
                    {"peak_bytes", q.peak_bytes()},
                    {"fits", q.fits()},
                    {"tokens_per_s_per_rank", q.has_step_time ? q.step.tokens_per_s_per_rank : 0.0},
                    {"step_seconds", q.has_step_time ? q.step.seconds : 0.0}});
  }
  return rows;
}

// The script draws everything from the embedded JSON; kept in one raw string so the page has no
// other dependency.
constexpr std::string_view kScript = R"JS(
const data = JSON.parse(document.getElementById('plan-data').textContent);
const plan = data.plan, sweep = data.sweep;
const MiB = 1048576, colors = ['#4e79a7','#f28e2b','#e15759','#76b7b2','#59a14f','#edc948',
  '#b07aa1','#ff9da7','#9c755f','#bab0ac','#8cd17d'];
const svgNS = 'http://www.w3.org/2000/svg';
function el(tag, attrs, text) {
  const e = document.createElementNS(svgNS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function value(key, text) {
  const s = document.createElement('span');
  s.className = 'value'; s.dataset.key = key; s.textContent = text; return s;
}
// Horizontal stacked bars: rows of {label, key, total, parts: [[name, value]]}.
function stacked(target, rows, unit, scale, digits) {
  const width = 760, left = 170, barH = 22, gap = 10;
  const max = Math.max(...rows.map(r => r.total), 1e-30);
  const names = [...new Set(rows.flatMap(r => r.parts.map(p => p[0])))];
  const svg = el('svg', {width: width + 120, height: rows.length * (barH + gap) + 30 +
                         Math.ceil(names.length / 4) * 18});
  rows.forEach((r, i) => {
    const y = i * (barH + gap);
    svg.appendChild(el('text', {x: 0, y: y + 16, 'font-size': 12}, r.label));
    let x = left;
    r.parts.forEach(([name, v]) => {
      const w = (width - left) * v / max;
      const rect = el('rect', {x: x, y: y, width: Math.max(w, 0), height: barH,
                               fill: colors[names.indexOf(name) % colors.length]});
      rect.appendChild(el('title', {}, name + ': ' + (v / scale).toFixed(digits) + ' ' + unit));
      svg.appendChild(rect); x += w;
    });
    svg.appendChild(el('text', {x: x + 6, y: y + 16, 'font-size': 12, 'data-key': r.key},
                       (r.total / scale).toFixed(digits) + ' ' + unit));
  });
  names.forEach((name, i) => {
    const x = (i % 4) * 200, y = rows.length * (barH + gap) + 10 + Math.floor(i / 4) * 18;
    svg.appendChild(el('rect', {x: x, y: y, width: 12, height: 12,
                                fill: colors[i % colors.length]}));
    svg.appendChild(el('text', {x: x + 16, y: y + 11, 'font-size': 11}, name));
  });
  target.appendChild(svg);
}
function table(target, header, rows) {
  const t = document.createElement('table');
  const h = t.insertRow(); header.forEach(c => { const th = document.createElement('th');
                                                 th.textContent = c; h.appendChild(th); });
  rows.forEach(r => { const tr = t.insertRow();
                      r.forEach(c => { const td = tr.insertCell();
                                       if (c instanceof Node) td.appendChild(c);
                                       else td.textContent = c; }); });
  target.appendChild(t);
}

const l = plan.layout;
document.getElementById('title').textContent =
  `${l.world} ranks: pp ${l.pp} x dp ${l.dp} (ep ${l.ep} x ep_dp ${l.ep_dp}), zero ${l.zero}, ` +
  `${l.microbatches} micro-batches, ${plan.hardware.name}`;
const summary = document.getElementById('summary');
table(summary, ['total parameters', 'active parameters', 'model FLOPs per token',
                'peak per rank (MiB)', 'fits'],
      [[value('params-total', String(plan.parameters.total)),
        value('params-active', String(plan.parameters.active)),
        value('flops-per-token', plan.flops_per_token.total.toExponential(4)),
        value('peak-mib', (plan.peak_bytes_per_rank / MiB).toFixed(1)),
        value('fits', plan.fits ? 'yes' : 'no')]]);

// Memory: the components that make up a rank's peak (plan/memory_model.h).
const memRows = plan.stages.map(s => {
  const m = s.memory_bytes;
  const parts = [['weights', m.weights], ['gradients', m.gradients],
    ['optimizer state', m.optimizer_state], ['bf16 copies', m.bf16_weight_copies],
    ['MX caches', m.mx_weight_caches], ['lent expert inputs', m.lent_expert_inputs],
    ['operand copies', m.operand_copies],
    ['activations', m.activations],
    ['scratch', m.workspace + m.mpi_scratch],
    ['dispatch buffers', m.dispatch_buffers], ['pipeline buffers', m.pipeline_buffers],
    ['runtime', m.runtime]];
  if (!plan.hardware.device) parts.push(['batch ids', m.batch_tokens]);
  return {label: `stage ${s.stage}`, key: `memory-stage-${s.stage}`, total: m.peak,
          parts: parts.filter(p => p[1] > 0)};
});
stacked(document.getElementById('memory'), memRows, 'MiB', MiB, 1);
table(document.getElementById('memory'), ['stage', 'peak (MiB)', 'activations (MiB)'],
      plan.stages.map(s => [String(s.stage),
        value(`peak-stage-${s.stage}`, (s.memory_bytes.peak / MiB).toFixed(1)),
        value(`activations-stage-${s.stage}`, (s.memory_bytes.activations / MiB).toFixed(1))]));

const time = document.getElementById('time');
if (plan.step_time) {
  const t = plan.step_time, b = t.breakdown_seconds;
  const cats = Object.keys(b).filter(k => b[k] > 0);
  stacked(time, cats.map(k => ({label: k, key: `time-${k}`, total: b[k], parts: [[k, b[k]]]})),
          'ms', 1e-3, 3);
  table(time, ['step (s)', 'tokens/s per rank', 'MFU (%)', 'pipeline wait (%)'],
        [[value('step-seconds', t.seconds.toPrecision(4)),
          value('tokens-per-s', t.tokens_per_s_per_rank.toPrecision(4)),
          value('mfu', (100 * t.mfu).toFixed(1)), value('bubble', (100 * t.bubble).toFixed(1))]]);
} else {
  time.textContent = 'no step time: the hardware profile has no rates';
}

const sw = document.getElementById('sweep');
if (sweep.length > 0 && sweep[0].tokens_per_s_per_rank > 0)
  stacked(sw, sweep.map(r => ({label: `ep ${r.ep}`, key: `sweep-bar-${r.ep}`,
                               total: r.tokens_per_s_per_rank,
                               parts: [['tokens/s per rank', r.tokens_per_s_per_rank]]})),
          'tokens/s', 1, 0);
table(sw, ['ep', 'peak per rank (MiB)', 'fits', 'tokens/s per rank'],
      sweep.map(r => [String(r.ep), value(`sweep-peak-${r.ep}`, (r.peak_bytes / MiB).toFixed(1)),
                      r.fits ? 'yes' : 'no',
                      value(`sweep-tps-${r.ep}`, r.tokens_per_s_per_rank.toPrecision(4))]));
document.body.dataset.rendered = 'yes';
)JS";

}  // namespace

std::string html_report(const Plan& p) {
  const nlohmann::json data = {{"plan", plan_json(p)}, {"sweep", ep_sweep(p)}};
  // "</" inside the JSON would end the script element early.
  std::string json = data.dump();
  for (size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3))
    json.replace(at, 2, "<\\/");
  std::string out =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>moecore plan</title>\n"
      "<style>body{font-family:sans-serif;margin:2em;max-width:64em}"
      "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;"
      "padding:2px 8px;text-align:right}h2{margin-top:1.5em}</style></head>\n<body>\n"
      "<h1>moecore plan</h1><p id=\"title\"></p><div id=\"summary\"></div>\n"
      "<h2>Memory per rank, by pipeline stage</h2><div id=\"memory\"></div>\n"
      "<h2>Where a step's time goes (the slowest stage)</h2><div id=\"time\"></div>\n"
      "<h2>Sweep over ep at the same world size</h2><div id=\"sweep\"></div>\n"
      "<script id=\"plan-data\" type=\"application/json\">";
  out += json;
  out += "</script>\n<script>";
  out += kScript;
  out += "</script>\n</body></html>\n";
  return out;
}

}  // namespace moecore::plan
