"""Annotated pages -> packed training samples ``[M | Y_1 .. Y_N]`` (one page, one sample).

``M`` is the page prompt of :meth:`ModelProtocol.prompt_ids` ("fork") with its single
``<|image_pad|>`` expanded to the image's token count, followed by the layout stream; ``Y_k`` is
branch k exactly as :func:`padoc_ray.protocol.serialize_padoc` writes it (branch-start, content,
EOS). Branch k forks after ``f_k = P + fork_points[k]`` tokens of ``M`` (``P`` = expanded prompt
length), which is what serving prompts it with (:func:`padoc_ray.protocol.child_prompt`).

Labels are already shifted: ``labels[i]`` is the token the logits at packed position ``i`` must
predict, ``-100`` where nothing is trained. Trained: every layout token (predicted from the token
before it in ``M``, the first from the prompt's last token) and every content token of a branch
including its EOS (predicted inside the branch). Not trained: prompt and image tokens, and each
branch's first token (branch-start is given to the branch, never a target of ``M``).

Position ids are Qwen3-VL M-RoPE ``(3, S)``: ``M``'s come from the model's own ``get_rope_index``
(run on a weightless copy of the model built on the meta device); token ``j`` of ``Y_k`` gets
``pos(M[f_k - 1]) + 1 + j`` in all three rows, i.e. exactly what ``get_rope_index`` gives the
linear sequence ``M[:f_k] + Y_k`` (the tests check this for every branch).

Truncation (samples longer than ``max_len``): whole regions are dropped from the end of the
reading order (their layout tokens and their branches) until the sample fits, and the layout is
re-closed with EOS. That closing EOS is then an input only, not a target, so the model is never
taught to end a page early; ``meta["dropped_regions"]`` records how many went. A branch is never
cut in the middle. A page whose prompt (with the image) does not fit, or whose first region alone
does not fit, is skipped with a :class:`PackingError` code. Pages arrive as
:class:`PageRef` (a :class:`~padoc_ray.protocol.Page` plus where its image is) from an
OmniDocBench JSON + images folder or from the batch job's Parquet rows, and may be weighted by a
corpus re-annotation's difficulty (:func:`sample_weight`: how often training draws a page).

This module knows nothing of attention kernels, optimizers or Ray.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from padoc_ray.protocol import Page, PageFormatError, SerializeError, page_from_omnidocbench, serialize_padoc
from padoc_ray.status import IMAGE_UNREADABLE, OK

from .config import PackingConfig
from .tree import TreeLayout

log = logging.getLogger(__name__)

IGNORE = -100  #: label of a position that is not trained

# ---- skip codes (stable strings, counted in the training summary) ---------------------------------
IMAGE_MISSING = "image_missing"  # the page's image file does not exist
BAD_ANNOTATION = "bad_annotation"  # the page JSON / row cannot be read as a page
SERIALIZE_FAILED = "serialize_failed"  # the page cannot be written as tokens (unknown category, NaN box)
PROMPT_TOO_LONG = "prompt_too_long"  # prompt + image tokens alone exceed max_len
REGION_TOO_LONG = "region_too_long"  # not even the first region (layout + whole branch) fits max_len
NOT_WEIGHTED = "not_in_sample_weights"  # --sample-weights has no row for the page
NO_CONSENSUS = "no_consensus"  # --sample-weights: the re-annotation found no consensus (weight 0)


class PackingError(Exception):
    """A page that cannot become a sample; ``code`` is one of the skip codes above."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


@dataclass
class PackedSample:
    """One packed page. Tensors are unbatched: the trainer adds the batch dimension (B=1).

    ``input_ids``/``labels`` (S,) long; ``loss_mask`` (S,) bool = ``labels != -100``;
    ``position_ids`` (3, S) long M-RoPE; ``pixel_values`` (patches, C*T*P*P) float and
    ``image_grid_thw`` (1, 3) long, as the checkpoint's image processor makes them.
    """

    input_ids: Any
    labels: Any
    loss_mask: Any
    position_ids: Any
    tree: TreeLayout
    pixel_values: Any
    image_grid_thw: Any
    meta: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_labels(self) -> int:
        return int(self.loss_mask.sum())

    def model_inputs(self, device=None, dtype=None) -> dict:
        """Keyword arguments for a Qwen3-VL forward (batch of one)."""
        pv = self.pixel_values.to(device=device, dtype=dtype) if dtype is not None else self.pixel_values.to(device)
        return {
            "input_ids": self.input_ids[None].to(device),
            "position_ids": self.position_ids[:, None].to(device),
            "pixel_values": pv,
            "image_grid_thw": self.image_grid_thw.to(device),
        }


# ---- where a page's image is ---------------------------------------------------------------------
@dataclass(frozen=True)
class ImageRef:
    """An image file, or page ``page_index`` of a PDF (``uri`` local or s3://)."""

    uri: str
    page_index: int | None = None  # None: ``uri`` is an image file

    def load(self, longest_side: int = 1600):
        from PIL import Image, UnidentifiedImageError

        if self.page_index is None and "://" not in self.uri:
            if not os.path.exists(self.uri):
                raise PackingError(IMAGE_MISSING, f"no image at {self.uri}")
            try:
                with Image.open(self.uri) as im:
                    return im.convert("RGB")
            except (UnidentifiedImageError, OSError) as e:
                raise PackingError(IMAGE_UNREADABLE, f"{self.uri}: {e}") from None
        return self._load_remote(longest_side)

    def _load_remote(self, longest_side: int):
        import io

        from PIL import Image, UnidentifiedImageError

        from padoc_ray.pdf import PdfError, RenderConfig, open_pdf, render_page
        from padoc_ray.storage import read_bytes

        try:
            data = read_bytes(self.uri)
        except (OSError, ValueError) as e:
            raise PackingError(IMAGE_MISSING, f"cannot read {self.uri}: {e}") from None
        if b"%PDF-" in data[:1024]:
            try:
                doc = open_pdf(data)
                try:
                    return render_page(doc, self.page_index or 0, RenderConfig(longest_side=longest_side)).image
                finally:
                    doc.close()
            except PdfError as e:
                raise PackingError(IMAGE_UNREADABLE, f"{self.uri} page {self.page_index}: {e}") from None
        try:
            with Image.open(io.BytesIO(data)) as im:
                return im.convert("RGB")
        except (UnidentifiedImageError, OSError) as e:
            raise PackingError(IMAGE_UNREADABLE, f"{self.uri}: {e}") from None


@dataclass(frozen=True)
class PageRef:
    """An annotated page and its image; ``source`` names it in logs and skip records."""

    page: Page
    image: ImageRef
    source: str
    weight: float = 1.0  #: relative sampling weight (``train --sample-weights``)


@dataclass(frozen=True)
class Skipped:
    source: str
    code: str
    message: str


def pages_from_omnidocbench(gt_path: str, images_dir: str, spec=None, *, drop_ignored: bool = False
                            ) -> tuple[list[PageRef], list[Skipped]]:
    """Pages of an OmniDocBench-format JSON list, images at ``images_dir/page_info.image_path``, else
    rendered from ``images_dir/page_info.source_pdf`` page ``page_no`` (what re-annotation's
    consensus.json names for PDF pages).

    A page that cannot be read, or whose image file is missing, is skipped with a reason.
    Raises ``ValueError`` when the file itself is not a JSON list of pages.
    """
    from padoc_ray.groundtruth import GroundTruthError, parse_truth

    try:
        with open(gt_path, "rb") as f:
            entries = parse_truth(f.read(), gt_path)
    except GroundTruthError as e:
        raise ValueError(str(e)) from None
    refs, skipped = [], []
    for t in entries:
        name = f"{os.path.basename(gt_path)}[{t.index}]"
        try:  # again with the checkpoint's spec and the caller's choice of ignored regions
            page = page_from_omnidocbench(t.obj, spec, drop_ignored=drop_ignored)
        except PageFormatError as e:
            skipped.append(Skipped(name, BAD_ANNOTATION, str(e)))
            continue
        pdf = os.path.basename(str(page.extra.get("source_pdf") or ""))
        if not page.image_path and not pdf:
            skipped.append(Skipped(name, IMAGE_MISSING, "page_info has neither image_path nor source_pdf"))
            continue
        path = os.path.join(images_dir, page.image_path or "")
        if page.image_path and os.path.isfile(path):
            refs.append(PageRef(page, ImageRef(path), page.image_path))
        elif pdf and os.path.isfile(os.path.join(images_dir, pdf)):  # rendered from the PDF itself
            refs.append(PageRef(page, ImageRef(os.path.join(images_dir, pdf), page.page_no), page.image_path or name))
        else:
            want = " or ".join(x for x in (path if page.image_path else "", os.path.join(images_dir, pdf) if pdf else "")
                               if x)
            skipped.append(Skipped(page.image_path or name, IMAGE_MISSING, f"no image at {want}"))
    return refs, skipped


def pages_from_batch_output(path: str) -> tuple[list[PageRef], list[Skipped]]:
    """Pages of padoc-ray batch output (``OUTPUT/pages/*.parquet`` or a folder/file of it) whose
    status is ``ok``; images are re-rendered from ``source_uri`` (PDF page or image file)."""
    from padoc_ray.output.reader import read_rows
    from padoc_ray.output.rows import RowFormatError, page_from_row

    cols = ["source_uri", "page_index", "status", "regions", "image_width", "image_height"]
    rows = read_rows(path, columns=cols, must_exist=True).to_pylist()
    refs, skipped = [], []
    for r in rows:
        name = f"{r['source_uri']}#{r['page_index']}"
        if r["status"] != OK:
            skipped.append(Skipped(name, BAD_ANNOTATION, f"status {r['status']}"))
            continue
        try:
            page = page_from_row(r)
            page = dataclasses.replace(page, width=page.width or 1, height=page.height or 1,
                                       regions=tuple(dataclasses.replace(g, order=None) for g in page.regions))
        except RowFormatError as e:
            skipped.append(Skipped(name, BAD_ANNOTATION, str(e)))
            continue
        refs.append(PageRef(page, ImageRef(r["source_uri"], int(r["page_index"])), name))
    return refs, skipped


#: the weight of the easiest page that has a consensus: the hardest (difficulty 1) is drawn
#: ``(SAMPLE_WEIGHT_FLOOR + 1) / SAMPLE_WEIGHT_FLOOR`` = 5 times as often
SAMPLE_WEIGHT_FLOOR = 0.25


def sample_weight(consensus: bool | None, difficulty: float | None) -> float:
    """How often training draws a page, from its re-annotation row: 0 without a consensus
    annotation (never drawn), else ``SAMPLE_WEIGHT_FLOOR + difficulty`` (harder pages more often;
    a page no two annotations were compared on counts as difficulty 0)."""
    if not consensus:
        return 0.0
    return SAMPLE_WEIGHT_FLOOR + min(1.0, max(0.0, difficulty or 0.0))


def apply_sample_weights(refs: list[PageRef], path: str) -> tuple[list[PageRef], list[Skipped]]:
    """Weight pages by a re-annotation's ``agreement.parquet`` (its ``kind = "page"`` rows), see
    :func:`sample_weight`. A page is found by its name (``image_path``), else by its source file
    name and page index. Pages without a consensus (weight 0) and pages the table does not hold are
    skipped with a reason."""
    import pyarrow.parquet as pq

    try:
        t = pq.read_table(path, columns=["kind", "image_path", "source_uri", "page_index", "consensus",
                                         "difficulty"])
    except Exception as e:  # noqa: BLE001 - any unreadable file: one clear message
        raise ValueError(f"--sample-weights {path}: not a re-annotation agreement.parquet ({e})") from None
    by_name, by_source = {}, {}
    for r in t.to_pylist():
        if r["kind"] != "page":
            continue
        w = sample_weight(r["consensus"], r["difficulty"])
        if r["image_path"]:
            by_name[r["image_path"]] = w
        if r["source_uri"] is not None:
            by_source[(os.path.basename(r["source_uri"]), r["page_index"])] = w
    out, skipped = [], []
    for ref in refs:
        key = (os.path.basename(ref.image.uri), ref.image.page_index or 0)
        w = by_name.get(ref.page.image_path or "") if ref.page.image_path in by_name else by_source.get(key)
        if w is None:
            skipped.append(Skipped(ref.source, NOT_WEIGHTED, f"not in {path}"))
        elif w <= 0:
            skipped.append(Skipped(ref.source, NO_CONSENSUS, "the re-annotation found no consensus for this page"))
        else:
            out.append(dataclasses.replace(ref, weight=w))
    return out, skipped


# ---- the packer ----------------------------------------------------------------------------------
def rope_index_fn(model_dir_or_config) -> Callable:
    """The checkpoint's own ``get_rope_index``, bound to a weightless (meta-device) model."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    cfg = model_dir_or_config
    if isinstance(cfg, str):
        cfg = AutoConfig.from_pretrained(cfg)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(cfg)
    return model.model.get_rope_index


class Packer:
    """Packs pages for one checkpoint (its tokenizer, protocol, image processor and M-RoPE)."""

    def __init__(self, model_dir: str, cfg: PackingConfig | None = None, *, rope_index: Callable | None = None):
        from transformers import AutoConfig, AutoImageProcessor

        from padoc_ray.tokenizer import ModelProtocol

        self.cfg = cfg = cfg if cfg is not None else PackingConfig()
        self.model_protocol = ModelProtocol(model_dir)
        if self.model_protocol.family != "padoc":
            raise ValueError(f"{model_dir} is a {self.model_protocol.family} checkpoint: the tree-varlen trainer trains "
                             f"the padoc family (Qwen3-VL with padoc_protocol.json); padoc-ray serves "
                             f"{self.model_protocol.family} checkpoints but does not train them")
        self.image_processor = AutoImageProcessor.from_pretrained(model_dir)
        config = AutoConfig.from_pretrained(model_dir)
        self.image_token_id = int(config.image_token_id)
        self.merge = int(config.vision_config.spatial_merge_size)
        self.rope_index = rope_index or rope_index_fn(config)
        self.prompt = tuple(self.model_protocol.prompt_ids("fork"))
        if self.prompt.count(self.image_token_id) != 1:
            raise ValueError(f"the fork prompt of {model_dir} must hold one <|image_pad|> (id {self.image_token_id})")
        self._proc_kw = {}
        if cfg.max_pixels or cfg.min_pixels:
            size = dict(self.image_processor.size)
            if cfg.max_pixels:
                size["longest_edge"] = cfg.max_pixels
            if cfg.min_pixels:
                size["shortest_edge"] = cfg.min_pixels
            self._proc_kw["size"] = size

    @property
    def processor_size_override(self) -> dict | None:
        """The image processor ``size`` used instead of the checkpoint's, if any."""
        return self._proc_kw.get("size")

    # -- pieces --
    def vision_inputs(self, image):
        out = self.image_processor(images=[image], return_tensors="pt", **self._proc_kw)
        return out["pixel_values"], out["image_grid_thw"]

    def expanded_prompt(self, grid_thw) -> list[int]:
        n = int(grid_thw.prod()) // (self.merge * self.merge)
        i = self.prompt.index(self.image_token_id)
        return [*self.prompt[:i], *([self.image_token_id] * n), *self.prompt[i + 1:]]

    def positions(self, ids: Sequence[int], grid_thw):
        """``get_rope_index`` of a linear sequence -> (3, len) long tensor."""
        import torch

        t = torch.tensor([list(ids)], dtype=torch.long)
        pos, _ = self.rope_index(t, (t == self.image_token_id).int(), image_grid_thw=grid_thw)
        return pos[:, 0, :]

    # -- the sample --
    def pack_ref(self, ref: PageRef) -> PackedSample:
        sample = self.pack(ref.page, ref.image.load())
        sample.meta["source"] = ref.source
        sample.meta["weight"] = ref.weight
        return sample

    def pack(self, page: Page, image) -> PackedSample:
        import torch

        pixel_values, grid = self.vision_inputs(image)
        prompt = self.expanded_prompt(grid)
        P, max_len = len(prompt), self.cfg.max_len
        if P + 1 > max_len:
            raise PackingError(PROMPT_TOO_LONG, f"prompt with {P - len(self.prompt) + 1} image tokens is {P} tokens; "
                                                f"max_len is {max_len}")
        vocab, tok = self.model_protocol.vocab, self.model_protocol.tokenizer
        try:
            full = serialize_padoc(vocab, tok, page)
        except SerializeError as e:
            raise PackingError(SERIALIZE_FAILED, str(e)) from None
        layout, branches, forks = _fit(full, P, max_len, vocab.end_of_stream)
        dropped = len(full.branches) - len(branches)
        M = [*prompt, *layout]
        tree = TreeLayout(len(M), tuple(P + f for f in forks), tuple(len(b) for b in branches))
        ids = M + [t for b in branches for t in b]
        labels = [IGNORE] * len(ids)
        for i in range(P - 1, len(M) - 1):
            labels[i] = M[i + 1]
        if dropped:
            labels[len(M) - 2] = IGNORE  # the re-closing EOS is an input only
        for s, b in zip(tree.branch_starts(), branches):
            labels[s:s + len(b) - 1] = b[1:]
        pos_m = self.positions(M, grid)
        pos = torch.empty(3, len(ids), dtype=torch.long)
        pos[:, :len(M)] = pos_m
        for f, s, n in zip(tree.forks, tree.branch_starts(), tree.branch_lens):
            base = pos_m[:, f - 1]
            if not bool((base == base[0]).all()):
                raise ValueError(f"fork {f} follows a vision token; branches must fork after text")
            pos[:, s:s + n] = base[0] + 1 + torch.arange(n)
        input_ids = torch.tensor(ids, dtype=torch.long)
        lab = torch.tensor(labels, dtype=torch.long)
        meta = {
            "page_no": page.page_no, "image_path": page.image_path, "regions": len(full.branches),
            "kept_regions": len(branches), "dropped_regions": dropped, "truncated": bool(dropped),
            "prompt_len": P, "image_tokens": P - len(self.prompt) + 1, "layout_len": len(layout),
            "branch_tokens": sum(len(b) for b in branches),
        }
        return PackedSample(input_ids=input_ids, labels=lab, loss_mask=lab != IGNORE, position_ids=pos, tree=tree,
                            pixel_values=pixel_values, image_grid_thw=grid, meta=meta)


def _fit(full, P: int, max_len: int, eos: int):
    """Keep the longest run of leading regions that fits (see the module docstring)."""
    layout, branches, forks = list(full.layout), list(full.branches), list(full.fork_points)
    total = P + len(layout) + sum(len(b) for b in branches)
    if total <= max_len:
        return layout, branches, forks
    n = len(branches)
    cost = total
    while n > 0 and cost > max_len:
        n -= 1
        end = forks[n - 1] + 1 if n else 0  # layout tokens through region n-1's close
        cost = P + end + 1 + sum(len(b) for b in branches[:n])
    if n == 0:
        first = P + forks[0] + 2 + 1 + len(branches[0])
        raise PackingError(REGION_TOO_LONG, f"the first region alone needs {first} tokens; max_len is {max_len}")
    end = forks[n - 1] + 1
    return [*layout[:end], eos], branches[:n], forks[:n]


def pack_pages(packer: Packer, refs: Iterable[PageRef]) -> tuple[list[PackedSample], list[Skipped]]:
    """Pack every page; a page that cannot be packed is skipped with its reason (logged)."""
    samples, skipped = [], []
    for ref in refs:
        try:
            samples.append(packer.pack_ref(ref))
        except PackingError as e:
            log.warning("skipping %s: %s", ref.source, e)
            skipped.append(Skipped(ref.source, e.code, e.message))
    return samples, skipped
