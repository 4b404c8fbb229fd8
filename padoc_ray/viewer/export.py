"""``padoc-ray view OUTPUT --export DIR``: a static HTML report of a sample, to share.

The sample: every page row that is not ``ok`` (and every document-level error row) of the
documents that are not ``ok``, plus ``per_status`` documents of each document status with their
first page. DIR gets ``index.html`` (the counts and the sample's list), one HTML file per page
view (``p<k>.html``, its image beside it when the source can be rendered) and the assets under
``static/``: it opens from disk, with no server, under the viewer's Content Security Policy (a
``<meta>`` element: nothing inline runs, nothing is fetched from elsewhere).
"""

from __future__ import annotations

import html
import os
import shutil

from padoc_ray import status
from padoc_ray.viewer.app import CSP, STATIC, doc_html, layout
from padoc_ray.viewer.data import Output

#: the viewer's Content Security Policy as a <meta> element: an exported page opened from disk has no server
#: to send the header (a <meta> policy cannot carry frame-ancestors: browsers ignore it there)
CSP_META = ('<meta http-equiv="Content-Security-Policy" content="'
            + html.escape("; ".join(d for d in CSP.split("; ") if not d.startswith("frame-ancestors"))) + '">')


def _with_csp(page: str) -> str:
    """``page`` with :data:`CSP_META` first in its head, before anything it governs."""
    return page.replace("<head>", "<head>" + CSP_META, 1)


def export(out: Output, images, folder: str, per_status: int = 3) -> dict:
    """Write the report; returns {"pages": page views written, "errors": error rows in it, "index": path}."""
    os.makedirs(folder, exist_ok=True)
    shutil.copytree(STATIC, os.path.join(folder, "static"), dirs_exist_ok=True)
    docs = out.documents.to_pylist()
    chosen, per = [], {}
    for d in docs:
        bad = d["status"] != status.DOC_OK
        if bad or per.get(d["status"], 0) < per_status:
            per[d["status"]] = per.get(d["status"], 0) + 1
            chosen.append((d, bad))
    items, errors, n = [], 0, 0
    for d, bad in chosen:
        rows = out.page_rows(d["source_uri"])
        pages = [r for r in rows if r["page_index"] >= 0]
        errors += sum(1 for r in rows if r["status"] != status.OK)
        want = [r for r in pages if r["status"] != status.OK] if bad else pages[:1]
        if bad and not want:
            want = pages[:1]
        links = {}
        for r in want:
            links[r["page_index"]] = f"p{n + len(links)}.html"
        for r in want:
            name = links[r["page_index"]]
            img = None
            try:
                data = images.png(r)
                img = name.replace(".html", ".png")
                with open(os.path.join(folder, img), "wb") as f:
                    f.write(data)
            except Exception:  # noqa: BLE001 - a source that cannot be rendered: the view without its image
                pass
            page = doc_html(d, rows, r["page_index"], image_url=lambda _r, img=img: img,
                            page_url=lambda i, links=links: links.get(i, "#"), static="static")
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.write(_with_csp(page.replace('href="/"', 'href="index.html"')))
        n += len(links)
        first = links[min(links)] if links else None
        label = html.escape(os.path.basename(d["source_uri"] or ""))
        codes = ", ".join(sorted({html.escape(r["error_code"] or "") for r in rows if r["error_code"]}))
        items.append(f'<tr><td>{f"<a href={first!r}>{label}</a>" if first else label}</td>'
                     f'<td>{html.escape(d["status"] or "")}</td><td class="pd-code">{codes}</td></tr>')
    counts = " ".join(f'<span class="pd-count">{html.escape(v or "(none)")} <b>{c}</b></span>'
                      for v, c in out.counts("status"))
    body = (f'<section class="pd-counts">{len(docs)} documents: {counts}</section>'
            '<table class="pd-docs"><thead><tr><th>file</th><th>status</th><th>error codes</th></tr></thead>'
            f'<tbody>{"".join(items)}</tbody></table>')
    index = os.path.join(folder, "index.html")
    with open(index, "w", encoding="utf-8") as f:
        f.write(_with_csp(layout("report", body, static="static").replace('href="/"', 'href="index.html"')))
    return {"pages": n, "errors": errors, "index": index}
