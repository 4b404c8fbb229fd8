/* padoc-ray view: draw the page view whose JSON the document page embeds. */
(function () {
  "use strict";
  var data = document.getElementById("pd-page-data");
  var root = document.getElementById("pd-page");
  if (data && root) window.PadocPage.render(root, JSON.parse(data.textContent));
})();
