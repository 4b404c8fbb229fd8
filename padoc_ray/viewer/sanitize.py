"""An allow-list HTML sanitizer for model output (table HTML, inline markup), run on the server.

Model content is data: a page whose content holds ``<script>`` or ``onerror=`` must run nothing
where it is shown. Rather than trust a browser-side library, every HTML fragment the viewer shows
passes through here: tags outside :data:`TAGS` are dropped (their text kept, escaped), the text of
:data:`DROP_CONTENT` tags is dropped with them, attributes outside :data:`ATTRS` are dropped (so no
event handler, style or URL survives), and all text is re-escaped. Built on the standard library's
tolerant :class:`html.parser.HTMLParser`; the output is well-formed (every open tag closed).
"""

from __future__ import annotations

import html
from html.parser import HTMLParser

#: tags kept (tables and inline text markup: what the model's HTML content holds)
TAGS = frozenset({"table", "thead", "tbody", "tfoot", "tr", "td", "th", "caption", "colgroup", "col", "br", "p",
                  "b", "i", "em", "strong", "u", "sub", "sup", "span", "div", "ul", "ol", "li", "hr"})
VOID = frozenset({"br", "col", "hr"})
#: tags dropped together with everything inside them
DROP_CONTENT = frozenset({"script", "style", "iframe", "object", "embed", "noscript", "template", "svg", "math",
                          "textarea", "title", "head", "xmp", "noembed", "noframes", "plaintext"})
#: tags whose "/>" a browser ignores (their content is raw text up to the end tag): they drop what follows
RAW_TEXT = frozenset({"script", "style", "textarea", "title", "xmp", "noembed", "noframes", "plaintext", "iframe",
                      "noscript"})
#: attributes kept, with the check their value must pass (small integers only: no URL, no script)
ATTRS = {"colspan": str.isdigit, "rowspan": str.isdigit}


class _Clean(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.open: list[str] = []
        self.dropping = 0  # depth inside a DROP_CONTENT tag

    def handle_starttag(self, tag, attrs):
        if tag in DROP_CONTENT:
            # a self-closed one (<svg/>, and <svg onload=z/>, whose "/" the parser reads into the attribute
            # value) holds nothing: only an open one drops what follows, up to its end tag. Not so script and
            # style: a browser ignores their "/>" and reads on as raw text, so what follows goes with them
            raw = self.get_starttag_text() or ""
            if tag not in VOID and (tag in RAW_TEXT or not raw.endswith("/>")):
                self.dropping += 1
            return
        if self.dropping or tag not in TAGS:
            return
        kept = "".join(f' {k}="{html.escape(v)}"' for k, v in attrs
                       if k in ATTRS and v is not None and len(v) <= 3 and ATTRS[k](v))
        self.out.append(f"<{tag}{kept}>")
        if tag not in VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        if tag in DROP_CONTENT and tag not in RAW_TEXT:  # self-closed: nothing inside it to drop
            return
        self.handle_starttag(tag, attrs)
        if tag in TAGS and tag not in VOID and not self.dropping and self.open and self.open[-1] == tag:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if tag in DROP_CONTENT:
            self.dropping = max(0, self.dropping - 1)
            return
        if self.dropping or tag not in self.open:
            return
        while self.open:  # close what was left open inside it
            t = self.open.pop()
            self.out.append(f"</{t}>")
            if t == tag:
                break

    def handle_data(self, data):
        if not self.dropping:
            self.out.append(html.escape(data, quote=False))


def sanitize_html(fragment: str) -> str:
    """``fragment`` with only allow-listed tags and attributes left; safe to insert as HTML."""
    p = _Clean()
    p.feed(fragment or "")
    p.close()  # an unclosed <script>'s text is dropped with it
    return "".join(p.out) + "".join(f"</{t}>" for t in reversed(p.open))
