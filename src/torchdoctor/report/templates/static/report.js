// The report's renderer, inlined into the page by html.py (the page is one file that opens offline).
// It inflates the embedded plotly.js and figure data (gzip+base64) and draws every figure div
// ([data-fig]). Figures in hidden rank panels are drawn when first shown: plotly sizes a plot from
// its container, which has no width while hidden. `data-td-status` on <html> tells tests (and
// curious users) whether every plot was drawn.
(function () {
  "use strict";
  var root = document.documentElement, errors = [];
  window.addEventListener("error", function (e) { errors.push(String(e.message || e)); });
  window.addEventListener("unhandledrejection", function (e) { errors.push(String(e.reason)); });
  function banner(msg) { var b = document.getElementById("td-banner"); b.textContent = msg; b.hidden = false; }
  async function inflate(el) {
    var b64 = el.textContent.trim();
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return await new Response(stream).text();
  }
  async function main() {
    var figsEl = document.getElementById("td-figures");
    var config = JSON.parse(document.getElementById("td-config").textContent);
    var drawn = 0;
    if (!figsEl.dataset.encoding && figsEl.textContent === "{}") {
      root.dataset.tdPlots = "0"; root.dataset.tdStatus = "ok"; return;
    }
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot unpack the embedded plotly.js (needs DecompressionStream: " +
                      "Chrome 80+, Firefox 113+, Safari 16.4+)");
    }
    var figs = JSON.parse(figsEl.dataset.encoding ? await inflate(figsEl) : figsEl.textContent);
    var code = await inflate(document.getElementById("td-plotly"));
    var s = document.createElement("script");
    s.textContent = code;
    document.head.appendChild(s);
    async function draw(div) {
      if (div.dataset.drawn) return;
      var f = figs[div.dataset.fig];
      div.dataset.drawn = "1";
      await Plotly.newPlot(div, f.data, f.layout || {}, config);
      drawn += 1;
    }
    var divs = document.querySelectorAll("[data-fig]");
    for (var i = 0; i < divs.length; i++) {
      if (divs[i].closest("[hidden]")) continue;
      await draw(divs[i]);
    }
    var sel = document.getElementById("td-rank");
    if (sel) sel.addEventListener("change", async function () {
      var panels = document.querySelectorAll(".rank-panel");
      for (var j = 0; j < panels.length; j++) panels[j].hidden = panels[j].dataset.rank !== sel.value;
      var shown = document.querySelectorAll('.rank-panel[data-rank="' + sel.value + '"] [data-fig]');
      for (var k = 0; k < shown.length; k++) { await draw(shown[k]); Plotly.Plots.resize(shown[k]); }
      root.dataset.tdPlots = String(drawn);
    });
    root.dataset.tdPlots = String(drawn);
    root.dataset.tdStatus = errors.length ? "error" : "ok";
    if (errors.length) root.dataset.tdErrors = errors.join(" | ");
  }
  main().catch(function (e) {
    root.dataset.tdStatus = "error";
    root.dataset.tdErrors = String(e && e.message || e);
    banner("Plots could not be drawn: " + (e && e.message || e));
  });
})();
