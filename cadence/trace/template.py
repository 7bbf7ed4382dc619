"""The HTML page of a trace report: one self-contained file (styles inline, pictures as data
URIs), filled by ``string.Template``; every ``$name`` is escaped HTML made by ``report``."""

from __future__ import annotations

from string import Template

PAGE = Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>$title</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #f0f0f0; } td.l, th.l { text-align: left; }
img { max-width: 100%; border: 1px solid #ddd; }
pre { background: #f7f7f7; padding: 0.6em; font-size: 0.85em; }
.note { color: #555; font-size: 0.85em; max-width: 70em; }
</style>
</head>
<body>
<h1>$title</h1>
<p class="note">$description</p>
<h2>Timeline</h2>
<img id="timeline" alt="timeline of the first measured steps" src="data:image/png;base64,$timeline">
<p class="note">Host step ranges and engine phases above the $lanes; $gap_note</p>
<h2>Per step</h2>
<pre id="summary">$summary</pre>
<img id="histograms" alt="per-step histograms" src="data:image/png;base64,$histograms">
<h2>By class</h2>
$classes
<h2>Per kernel</h2>
<p class="note">$kernel_note</p>
$kernels
$compare
<script>
// The decoded width of every picture, for headless checks (0: it did not decode).
window.addEventListener("load", function () {
  document.body.dataset.images = Array.from(document.images).map(function (i) {
    return i.naturalWidth; }).join(",");
});
</script>
</body>
</html>
""")
