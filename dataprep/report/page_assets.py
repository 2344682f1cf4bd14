"""The fixed parts of the report page: its stylesheet, its script (draws the charts, fitted to
the window's width; sorts tables; opens every section for printing) and the glossary of the
figures it shows (term -> one-line definition, shown on the page and as tooltips)."""

from __future__ import annotations

#: the figures and words the page uses, defined where a reader sees them (order kept)
GLOSSARY: dict[str, str] = {
    "corpus": "the manifest's corpus column (the blend's names), or the source file for a manifest without one.",
    "TPS": "tokens per second: an utterance's tokens (prompt included) divided by its duration.",
    "bucket": "a range of duration (and, in a 2D grid, of tokens: its sub-buckets) whose utterances are batched "
              "together, with one batch size.",
    "carried rows": "a bucket's tail (its utterances beyond a multiple of the batch size, when at most half a batch) "
                    "moved up to the next sub-bucket of its duration that holds their tokens, so no small last "
                    "batch is formed; on a small corpus this can empty a sub-bucket.",
    "audio padding": "1 - real audio seconds / padded seconds (batch size x the batch's longest utterance), "
                     "over the batches.",
    "token padding": "1 - real tokens / padded tokens (batch size x the batch's most tokens), over the batches.",
    "fill": "how full the batches are: the utterances in the batches / the full batch sizes of their buckets "
            "(100% = every batch full).",
    "straggler": "how much longer a step lasts than its mean rank: the mean over steps of slowest rank time / "
                 "mean rank time - 1 (predicted).",
    "idle": "share of the ranks' time spent waiting for the slowest rank of each step (predicted).",
    "same-bucket steps": "share of steps at which every rank trains a batch of the same bucket.",
    "balance": "at a step, the largest rank's padded audio seconds / the mean over ranks (1.0 = even); the "
               "figure above is its mean over the steps.",
    "dropped rows": "utterances the plan could not place in any batch (left out of training).",
    "step time": "predicted by the cost model (seconds; compare them to each other, not to a wall clock).",
    "target": "a corpus's probability in the blend (its weights at each level raised to the temperature and "
              "normalized); each epoch plans round(target x epoch size) of its utterances.",
    "achieved": "the corpus's share of the utterances an epoch actually planned.",
    "sync / unsync": "synchronized: every rank trains the same bucket at a step; unsynchronized: each rank draws "
                     "its own (the same batches dealt at random).",
    "sync saves": "1 - epoch time synchronized / epoch time unsynchronized (negative: synchronizing costs time).",
    "representative": "whether a simulated world size has at least as many batches per bucket as ranks; below, "
                      "most steps are re-split tails and the comparison says little.",
}


def term_id(term: str) -> str:
    """The element id of a glossary entry."""
    return "term-" + "".join(ch if ch.isalnum() else "-" for ch in term.lower())


CSS = """
:root{--fg:#1d2430;--mut:#5b6573;--line:#d9dee5;--bg:#fff;--acc:#3b75af}
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
background:var(--bg);margin:0 auto;max-width:1000px;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 4px}h2{display:inline;font-size:18px;margin:0}
header p,.intro,.note,dd,.line{overflow-wrap:anywhere}
header p{margin:2px 0;color:var(--mut)}nav{margin:10px 0 4px}nav a{margin-right:14px;color:var(--acc)}
details.section,section.terms{border-top:2px solid var(--line);padding:8px 0 4px;margin-top:14px}
summary{cursor:pointer;padding:4px 0}.intro{color:var(--mut);margin:4px 0 8px}
.fig{margin:14px 0;break-inside:avoid;page-break-inside:avoid}figcaption{font-weight:600;margin-bottom:6px}
.note{color:var(--mut);font-size:12.5px;margin:4px 0}.line{margin:8px 0}
.kpis{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}.kpi{border:1px solid var(--line);border-radius:6px;
padding:6px 12px;min-width:110px}.kpi .v{font-size:18px;font-weight:600}.kpi .k{color:var(--mut);font-size:12px}
a.term{color:inherit;text-decoration:underline dotted}
.scroll{max-height:420px;overflow:auto;border:1px solid var(--line);border-radius:4px}
table{border-collapse:collapse;width:100%;font-size:12.5px}th,td{padding:3px 8px;border-bottom:1px solid var(--line);
text-align:left;vertical-align:top}td.n{text-align:right;font-variant-numeric:tabular-nums}
th{position:sticky;top:0;background:#f4f6f9;cursor:pointer;user-select:none;vertical-align:bottom}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
td{word-break:break-word}td.n{white-space:nowrap}.vega-bindings{margin:6px 0 0 8px}.vega-bind-name{font-weight:600}
.vega-bind input[type=range]{max-width:55vw}
.chart{max-width:100%}.chart svg{max-width:100%;height:auto}
dl.terms{display:grid;grid-template-columns:max-content 1fr;gap:4px 14px;margin:8px 0}dt{font-weight:600}dd{margin:0}
@media (max-width:600px){body{padding:10px 10px 32px}dl.terms{grid-template-columns:1fr}dd{margin:0 0 6px}
table{min-width:560px}
.kpi{min-width:0;flex:1 1 40%}}
@media print{@page{size:A4;margin:12mm}body{max-width:none;padding:0;font-size:11px}nav{display:none}
.scroll{max-height:none;overflow:visible;border:0}th{position:static}summary{list-style:none}
.vega-bindings{display:none}details.section{break-before:page}details.section:first-of-type{break-before:auto}}
"""

#: Draws every chart with Vega (SVG) at a width that fits its place: on a narrow window the
#: charts are narrowed, side-by-side charts stacked and legends put below; a last CSS rule
#: scales any SVG still wider than its place. Sets ``window.__report`` (ready, errors, charts)
#: for tests and tools.
JS = r"""
(function(){
  var state = window.__report = {ready:false, errors:[], charts:0};
  window.addEventListener('error', function(e){ state.errors.push(String(e.message || e)); });
  var specs = JSON.parse(document.getElementById('report-specs').textContent);
  function fit(spec, avail){
    if (avail >= 860) return spec;
    var s = JSON.parse(JSON.stringify(spec)), room = Math.max(120, avail - 90);
    s.config = s.config || {};
    s.config.legend = Object.assign({}, s.config.legend || {}, {orient:'bottom', columns:4});
    (function walk(n){
      if (!n || typeof n !== 'object') return;
      if (Array.isArray(n)) { n.forEach(walk); return; }
      if (n.hconcat) { n.vconcat = n.hconcat; delete n.hconcat; }
      if (typeof n.width === 'number' && n.width > room) n.width = room;
      if (n.legend && typeof n.legend === 'object' && n.legend.orient) n.legend.orient = 'bottom';
      ['vconcat', 'layer', 'spec'].forEach(function(k){ walk(n[k]); });
      if (n.encoding) Object.keys(n.encoding).forEach(function(k){ walk(n.encoding[k]); });
    })(s);
    return s;
  }
  var jobs = Object.keys(specs).map(function(id){
    var el = document.getElementById(id);
    return vegaEmbed(el, fit(specs[id], el.clientWidth), {renderer:'svg', actions:false})
      .then(function(){ state.charts += 1; })
      .catch(function(e){ state.errors.push(id + ': ' + e); });
  });
  Promise.all(jobs).then(function(){ state.ready = true; state.ms = performance.now();
    document.body.setAttribute('data-ready', '1'); });
  function key(td){ var v = td.getAttribute('data-v'); return v === null ? td.textContent : parseFloat(v); }
  document.querySelectorAll('table.sortable').forEach(function(table){
    table.querySelectorAll('th').forEach(function(th, col){
      th.addEventListener('click', function(){
        var asc = th.getAttribute('aria-sort') !== 'ascending';
        table.querySelectorAll('th').forEach(function(o){ o.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        rows.sort(function(a, b){
          var x = key(a.cells[col]), y = key(b.cells[col]);
          var c = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
          return asc ? c : -c; });
        rows.forEach(function(r){ body.appendChild(r); });
      });
    });
  });
  window.addEventListener('beforeprint', function(){
    document.querySelectorAll('details').forEach(function(d){ d.open = true; }); });
})();
"""
