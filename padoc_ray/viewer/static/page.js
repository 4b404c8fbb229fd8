/* padoc-ray page view: a page image with its region boxes, its Markdown blocks beside it, the raw row.
 * PadocPage.render(root, view) draws the JSON of padoc_ray.viewer.pageview.page_view (plus image_url).
 * Block HTML is sanitized on the server; everything else is set as text. Hovering or clicking a box
 * highlights its block and the other way round (they share the region's reading-order number). */
(function (global) {
  "use strict";

  function el(tag, cls, text) {
    var n = document.createElement(tag);
    if (cls) n.className = cls;
    if (text !== undefined) n.textContent = text;
    return n;
  }

  function render(root, view) {
    root.textContent = "";
    var wrap = el("div", "pd-view");
    var fig = el("div", "pd-image");
    if (view.image_width && view.image_height) fig.style.aspectRatio = view.image_width + " / " + view.image_height;
    var img = el("img", "pd-img");
    img.alt = "page " + (view.page_index + 1);
    img.addEventListener("error", function () { fig.classList.add("pd-noimage"); });
    if (view.image_url) img.src = view.image_url;
    fig.appendChild(img);
    var boxes = {}, blocks = {};

    (view.regions || []).forEach(function (r) {
      var b = el("div", "pd-box");
      b.dataset.order = r.order;
      b.dataset.category = r.category || "";
      b.title = (r.order + 1) + ": " + (r.category || "");
      b.style.left = (r.bbox[0] * 100) + "%";
      b.style.top = (r.bbox[1] * 100) + "%";
      b.style.width = ((r.bbox[2] - r.bbox[0]) * 100) + "%";
      b.style.height = ((r.bbox[3] - r.bbox[1]) * 100) + "%";
      b.style.borderColor = r.color;
      var num = el("span", "pd-num", String(r.order + 1));
      num.style.background = r.color;
      b.appendChild(num);
      fig.appendChild(b);
      boxes[r.order] = b;
    });

    var md = el("div", "pd-md");
    (view.blocks || []).forEach(function (k) {
      var d = el("div", "pd-block");
      d.dataset.order = k.order;
      d.dataset.category = k.category || "";
      d.innerHTML = k.html; // sanitized by padoc_ray.viewer.sanitize on the server
      md.appendChild(d);
      blocks[k.order] = d;
    });
    if (!(view.blocks || []).length) md.appendChild(el("p", "pd-empty", "no Markdown on this page"));

    function mark(order, cls, on) {
      [boxes[order], blocks[order]].forEach(function (n) { if (n) n.classList.toggle(cls, on); });
    }
    function select(order, from) {
      var was = root.querySelectorAll(".pd-active");
      var same = boxes[order] && boxes[order].classList.contains("pd-active");
      Array.prototype.forEach.call(was, function (n) { n.classList.remove("pd-active"); });
      if (same) return;
      mark(order, "pd-active", true);
      var other = from === "box" ? blocks[order] : boxes[order];
      if (other && other.scrollIntoView) other.scrollIntoView({block: "nearest"});
    }
    function wire(map, from) {
      Object.keys(map).forEach(function (o) {
        var n = map[o], order = Number(o);
        n.addEventListener("mouseenter", function () { mark(order, "pd-hover", true); });
        n.addEventListener("mouseleave", function () { mark(order, "pd-hover", false); });
        n.addEventListener("click", function () { select(order, from); });
      });
    }
    wire(boxes, "box");
    wire(blocks, "block");

    wrap.appendChild(fig);
    wrap.appendChild(md);
    root.appendChild(wrap);
    var raw = el("details", "pd-raw");
    raw.appendChild(el("summary", null, "raw row (JSON)"));
    raw.appendChild(el("pre", "pd-json", JSON.stringify(view.row, null, 2)));
    root.appendChild(raw);
    return {boxes: boxes, blocks: blocks};
  }

  global.PadocPage = {render: render};
})(window);
