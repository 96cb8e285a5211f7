// Times as the person reads them: each <time datetime="…Z"> (and each UTC time the governor
// wrote into a title, "2026-01-05 09:14 UTC") becomes their clock time, with the day when it is
// not today ("14:02", "Jan 5, 14:02"), as in JupyterLab (labextension/src/format.ts). The page
// says UTC until this runs, and the exact UTC time stays in the tooltip.
(function () {
  "use strict";
  var now = new Date();
  function day(d) {
    return d.toLocaleDateString(undefined, { month: "short", day: "numeric" });
  }
  function clock(d) {
    return d.toLocaleTimeString(undefined, { hour: "numeric", minute: "2-digit" });
  }
  function format(d) {
    return day(d) === day(now) ? clock(d) : day(d) + ", " + clock(d);
  }
  var UTC = /\b(?:(\d{4})-(\d{2})-(\d{2})[ T])?(\d{2}):(\d{2})(?::(\d{2}))? UTC\b/g;
  function localize(text) {
    return text.replace(UTC, function (match, y, mo, d, h, mi, s) {
      var at;
      if (y) {
        at = Date.UTC(+y, +mo - 1, +d, +h, +mi, +(s || 0));
      } else {
        var base = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate(), +h, +mi);
        at = [base - 864e5, base, base + 864e5].reduce(function (a, b) {
          return Math.abs(b - now) < Math.abs(a - now) ? b : a;
        });
      }
      return isFinite(at) ? format(new Date(at)) : match;
    });
  }
  document.querySelectorAll("time[datetime]").forEach(function (node) {
    var at = new Date(node.getAttribute("datetime"));
    if (!isNaN(at)) {
      node.title = node.textContent;
      node.textContent = format(at);
    }
  });
  document.querySelectorAll("[title*=' UTC']:not(time)").forEach(function (node) {
    node.title = localize(node.title);
  });
  document.querySelectorAll(".utc-note").forEach(function (node) {
    node.hidden = true; // the times above are no longer UTC
  });
})();
