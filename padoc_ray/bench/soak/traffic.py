"""The soak benchmark's traffic: its inputs and one closed-loop HTTP client (blocking ``requests``
in a thread), which picks a request kind from :data:`MIX` each round.

Kinds: ``parse`` (sync /v1/parse), ``stream`` (NDJSON, read to its ``result`` line), ``job`` (create,
poll, fetch the result; a quarter cancelled soon after creation), ``chat`` (one page image as a
base64 data URL), ``meta`` (/v1/models, /healthz, /readyz), ``bad`` (a corrupt PDF, not a PDF, an
empty file or an encrypted PDF, to /v1/parse or /v1/jobs: must get 4xx) and ``disconnect`` (a
client that goes away: mid-upload, right after sending, or after a stream's first line).
A 503 with Retry-After makes the client wait as told (at most 2 s) before its next request.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import random
import socket
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field

from padoc_ray import status
from padoc_ray.bench.soak.report import JobTrace, Response

#: request kinds and their shares of the client loop's picks (bad inputs about 1%)
MIX = {"parse": 0.30, "stream": 0.20, "job": 0.17, "chat": 0.15, "disconnect": 0.06, "meta": 0.11, "bad": 0.01}

CANCEL_SHARE = 0.25  #: jobs cancelled by the client soon after creation
POLL_S = 0.3  #: job polling interval


@dataclass
class Inputs:
    good: dict[str, tuple[bytes, int]]  #: upload name -> (PDF bytes, pages)
    bad: dict[str, bytes]  #: upload name -> bytes the service must refuse with 4xx
    images: dict[str, str]  #: name -> a page image as a base64 PNG data URL
    #: a generated PDF's name -> the (example name, page index) each of its pages is a copy of
    origins: dict[str, list[tuple[str, int]]] = field(default_factory=dict)


def soak_inputs(examples_dir: str) -> Inputs:
    """The examples' PDFs (their names keep teacher forcing on), two generated from their pages (a
    5-page mix and a 12-page document, for jobs long enough to cancel), the four bad inputs, and
    each example's first page as a PNG for chat."""
    import pikepdf
    import pypdfium2

    good: dict[str, tuple[bytes, int]] = {}
    for name in sorted(os.listdir(examples_dir)):
        if name.endswith(".pdf"):
            with open(os.path.join(examples_dir, name), "rb") as f:
                data = f.read()
            good[name] = (data, len(pypdfium2.PdfDocument(data)))
    if not good:
        raise ValueError(f"no PDFs in {examples_dir}")
    sources = [pikepdf.open(io.BytesIO(d)) for d, _ in good.values()]
    pages = [p for pdf in sources for p in pdf.pages]
    where = [(name, i) for name, (_, n) in good.items() for i in range(n)]
    origins: dict[str, list[tuple[str, int]]] = {}

    def made(name: str, n: int) -> None:
        out = pikepdf.new()
        for i in range(n):
            out.pages.append(pages[i % len(pages)])
        buf = io.BytesIO()
        out.save(buf)
        good[name] = (buf.getvalue(), n)
        origins[name] = [where[i % len(where)] for i in range(n)]

    made("soak-mix.pdf", len(pages))
    made("soak-long.pdf", 12)
    enc = io.BytesIO()
    sources[0].save(enc, encryption=pikepdf.Encryption(user="soak-secret", owner="soak-owner"))
    first = next(iter(good.values()))[0]
    bad = {"corrupt.pdf": b"%PDF-1.7\n" + bytes(range(256)) * 40, "truncated.pdf": first[: len(first) // 3],
           "notes.txt": b"just some text, not a PDF\n", "empty.pdf": b"", "encrypted.pdf": enc.getvalue()}
    images = {}
    for name in list(good)[:3]:
        img = pypdfium2.PdfDocument(good[name][0])[0].render(scale=1).to_pil()
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        images[name] = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return Inputs(good, bad, images, origins)


def write_replay_truth(gt_path: str, inputs: Inputs, out_path: str) -> str:
    """``gt_path``'s OmniDocBench ground truth plus entries for the generated PDFs' pages (copies of
    their examples' pages), so that every upload is teacher-forced; returns ``out_path``."""
    import copy
    import json

    with open(gt_path, encoding="utf-8") as f:
        gt = json.load(f)
    by_page = {(g["page_info"]["source_pdf"], g["page_info"]["page_no"]): g for g in gt}
    for name, pages in inputs.origins.items():
        for i, key in enumerate(pages):
            if key in by_page:
                g = copy.deepcopy(by_page[key])
                g["page_info"].update(source_pdf=name, page_no=i, image_path=f"{name[:-4]}_page{i}.png")
                gt.append(g)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(gt, f)
    return out_path


@dataclass
class Shared:
    """What every client shares: the service, the inputs and the records (appends only)."""

    url: str
    token: str
    inputs: Inputs
    timeout_s: float
    responses: list[Response] = field(default_factory=list)
    jobs: list[JobTrace] = field(default_factory=list)
    anomalies: Counter = field(default_factory=Counter)  #: answers that are not what the request should get
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def note(self, what: str) -> None:
        with self.lock:
            self.anomalies[what] += 1


class Client:
    def __init__(self, shared: Shared, rng: random.Random, stop: threading.Event):
        import requests

        self.sh, self.rng, self.stop = shared, rng, stop
        self.s = requests.Session()
        self.kinds, self.weights = list(MIX), list(MIX.values())

    def loop(self) -> None:
        try:
            while not self.stop.is_set():
                getattr(self, self.rng.choices(self.kinds, self.weights)[0])()
        finally:
            self.s.close()

    # ---- one request ----
    def send(self, kind: str, method: str, path: str, stream: bool = False, **kw):
        """One request, recorded; returns the response (None when none came back)."""
        import requests

        t = time.perf_counter()
        try:
            r = self.s.request(method, self.sh.url + path, headers=self.sh.headers, timeout=self.sh.timeout_s,
                               stream=stream, **kw)
        except requests.RequestException as e:
            self.sh.responses.append(Response(kind, None, time.perf_counter() - t, error=type(e).__name__))
            return None
        if not stream:
            self.record(kind, r, t)
        return r

    def record(self, kind: str, r, t: float) -> None:
        ra = r.headers.get("Retry-After")
        self.sh.responses.append(Response(kind, r.status_code, time.perf_counter() - t, retry_after=ra))
        if r.status_code == 503 and ra:
            with contextlib.suppress(ValueError):
                self.stop.wait(min(float(ra), 2.0))

    def _doc(self) -> tuple[str, bytes, int]:
        name = self.rng.choice(list(self.sh.inputs.good))
        data, n = self.sh.inputs.good[name]
        return name, data, n

    # ---- the kinds ----
    def parse(self) -> None:
        name, data, _ = self._doc()
        r = self.send("parse", "POST", "/v1/parse", files={"file": (name, data, "application/pdf")})
        if r is not None and r.status_code == 200 and r.json().get("status") not in (status.DOC_OK, status.DOC_PARTIAL):
            self.sh.note(f"parse_status_{r.json().get('status')}: {name}")

    def stream(self) -> None:
        name, data, _ = self._doc()
        t = time.perf_counter()
        r = self.send("stream", "POST", "/v1/parse", stream=True, params={"stream": "true"},
                      files={"file": (name, data, "application/pdf")})
        if r is None:
            return
        import requests

        last = b""
        try:
            with r:
                for line in r.iter_lines():
                    last = line or last
        except requests.RequestException as e:
            self.sh.responses.append(Response("stream", None, time.perf_counter() - t, error=type(e).__name__))
            return
        self.record("stream", r, t)
        if r.status_code == 200 and b'"type": "result"' not in last:
            self.sh.note("stream_without_result_line")

    def job(self) -> None:
        name, data, n = self._doc()
        r = self.send("job_create", "POST", "/v1/jobs", files={"file": (name, data, "application/pdf")})
        if r is None or r.status_code != 202:
            return
        view = r.json()
        trace = JobTrace(view["id"], tuple(range(n)))
        if view.get("pages_total") != n:
            self.sh.note(f"job_pages_total_{view.get('pages_total')}_not_{n}")
        self.sh.jobs.append(trace)
        if self.rng.random() < CANCEL_SHARE:
            self.stop.wait(self.rng.uniform(0, 0.5))
            trace.cancel_sent = self.send("job_cancel", "DELETE", f"/v1/jobs/{trace.id}") is not None
        while not self.stop.is_set() and not self.settle(trace):
            self.stop.wait(POLL_S)

    def settle(self, trace: JobTrace, kind_prefix: str = "job") -> bool:
        """Poll the job once; once final (and done), fetch its result. True: nothing left to do."""
        if trace.final_status not in status.JOB_FINAL:
            r = self.send(f"{kind_prefix}_poll", "GET", f"/v1/jobs/{trace.id}")
            if r is None or r.status_code != 200:
                return False
            trace.final_status = r.json()["status"]
            if trace.final_status not in status.JOB_FINAL:
                return False
        if trace.final_status == status.JOB_DONE and trace.result_pages is None:
            r = self.send(f"{kind_prefix}_result", "GET", f"/v1/jobs/{trace.id}/result")
            trace.result_code = None if r is None else r.status_code
            if r is None or r.status_code != 200:
                return False
            trace.result_pages = [p["page_index"] for p in r.json()["pages"]]
        return True

    def chat(self) -> None:
        name = self.rng.choice(list(self.sh.inputs.images))
        body = {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "Parse this page."},
            {"type": "image_url", "image_url": {"url": self.sh.inputs.images[name]}}]}],
            "padoc": {"filename": name}}
        r = self.send("chat", "POST", "/v1/chat/completions", json=body)
        if r is not None and r.status_code == 200 and "choices" not in r.json():
            self.sh.note("chat_without_choices")

    def meta(self) -> None:
        path = self.rng.choice(("/v1/models", "/healthz", "/readyz"))
        self.send("meta", "GET", path)

    def bad(self) -> None:
        name = self.rng.choice(list(self.sh.inputs.bad))
        path = self.rng.choice(("/v1/parse", "/v1/jobs"))
        r = self.send("bad", "POST", path, files={"file": (name, self.sh.inputs.bad[name], "application/pdf")})
        if r is not None and not 400 <= r.status_code < 500:
            self.sh.note(f"bad_input_{name}_got_{r.status_code}")

    def disconnect(self) -> None:
        how = self.rng.choice(("upload", "sent", "stream"))
        name, data, _ = self._doc()
        if how == "stream":
            t = time.perf_counter()
            r = self.send("disconnect_stream", "POST", "/v1/parse", stream=True, params={"stream": "true"},
                          files={"file": (name, data, "application/pdf")})
            if r is not None:
                with r, contextlib.suppress(Exception):
                    next(r.iter_lines(), None)
                self.record("disconnect_stream", r, t)
            return
        import requests

        req = requests.Request("POST", self.sh.url + "/v1/parse", headers=self.sh.headers,
                               files={"file": (name, data, "application/pdf")}).prepare()
        body = req.body
        cut = len(body) // 2 if how == "upload" else len(body)
        u = urllib.parse.urlsplit(self.sh.url)
        head = f"POST /v1/parse HTTP/1.1\r\nHost: {u.netloc}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in req.headers.items()) + "\r\n"
        t = time.perf_counter()
        try:
            with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
                sock.sendall(head.encode() + body[:cut])
                if how == "sent":
                    self.stop.wait(self.rng.uniform(0, 0.2))
            err = "disconnected"
        except OSError as e:
            err = type(e).__name__
        self.sh.responses.append(Response(f"disconnect_{how}", None, time.perf_counter() - t, error=err))


def drain_jobs(shared: Shared, drain_s: float) -> int:
    """After the traffic: poll every unfinished job (and fetch missing results) for up to
    ``drain_s``; returns how many jobs are still unsettled."""
    c = Client(shared, random.Random(0), threading.Event())
    end = time.monotonic() + drain_s
    try:
        while True:
            left = [j for j in list(shared.jobs) if not c.settle(j, "drain")]
            if not left or time.monotonic() > end:
                return len(left)
            time.sleep(1.0)
    finally:
        c.s.close()
