"""The batch job's configuration: :class:`BatchConfig` and its sections, validated, with documented defaults."""

from __future__ import annotations

import math
import uuid
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from typing import Mapping

from padoc_ray.host import HostConfig
from padoc_ray.pdf import RenderConfig
from padoc_ray.pipeline.limits import InputLimits
from padoc_ray.storage import StorageConfig
from padoc_ray.knobs import knob, range_text
from padoc_ray.listing import output_inside_input
from padoc_ray.raster import ENCODINGS, RendererConfig


@dataclass(frozen=True, kw_only=True)
class InputsConfig:
    """What the job reads: how inputs are listed and reached, which pages of them, and the caps that
    keep one hostile input from exhausting the job."""

    limits: InputLimits = field(default_factory=InputLimits)  #: caps per input (pages, frames, bytes)
    #: 0-based page indices to parse (None: all)
    pages: tuple[int, ...] | None = knob(None, parse="page_ranges", to_field=lambda v: None if v is None else tuple(v),
                                         default_text="all",
                                         help="1-based page ranges to parse in every document, e.g. 1-3,7")
    #: parse at most this many pages of each document (None: all)
    max_pages_per_doc: int | None = knob(None, metavar="N", default_text="all")
    #: a folder or s3://bucket/prefix that a manifest --input may name (repeatable; replaces the default, the
    #: manifest's own folder). Lines outside get a row with status disallowed_uri and are never read
    manifest_allow: tuple[str, ...] = knob((), action="append", metavar="PREFIX", to_field=tuple, from_field=list)
    #: follow symbolic links in an --input folder whose target is inside it (each folder entered once, no file
    #: listed twice). Off: each link is a row with status symlink, never read (see padoc_ray.listing.list_inputs)
    follow_symlinks: bool = False

    def __post_init__(self) -> None:
        if self.max_pages_per_doc is not None and self.max_pages_per_doc < 1:
            raise ValueError("max_pages_per_doc must be >= 1")


@dataclass(frozen=True, kw_only=True)
class RasterConfig:
    """The raster stage: CPU tasks that read inputs, render their pages and send them on in blocks."""

    render: RenderConfig = field(default_factory=RenderConfig)
    #: rendering deadlines and crash isolation (per page 120 s, per document 600 s, own process)
    renderer: RendererConfig = field(default_factory=RendererConfig)
    #: CPUs Ray reserves per rasterization task; a task mostly waits on its renderer process and Ray Data
    #: keeps part of the CPU budget for later stages, so 0.25 keeps every core rendering (measured: steady
    #: no-op pipeline 237 pages/s at 0.25 vs 142 at 0.5 on 2 cores)
    cpus: float = knob(0.25, flags=("--raster-cpus",))
    #: target size of blocks of rendered pages (bounds memory in flight)
    block_mb: int = knob(16, flags=("--raster-block-mb",), metavar="MB")
    #: input files per rasterization task; None: up to 8, fewer when there are few files per CPU (small
    #: files then share Ray's per-task cost; a large document still streams page by page)
    docs_per_task: int | None = knob(None, flags=("--raster-docs-per-task",), default_text="auto")
    #: rendered pages per block leaving the raster stage
    pages_per_block: int = knob(16, flags=("--raster-pages-per-block",))
    #: how rendered pages travel to engine actors, all lossless: zstd (raw pixels, zstd level 1: ~3 ms to
    #: encode, as small as PNG), png (~33 ms to encode), or ppm (uncompressed)
    encoding: str = knob("zstd", flags=("--image-encoding",), choices=ENCODINGS)

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"image_encoding must be one of {', '.join(ENCODINGS)}, got {self.encoding!r}")
        docs_per_task = 1 if self.docs_per_task is None else self.docs_per_task  # 0 is not "auto"
        if self.pages_per_block < 1 or docs_per_task < 1:
            raise ValueError("raster_docs_per_task and raster_pages_per_block must be >= 1")
        if self.cpus <= 0:
            raise ValueError("raster_cpus must be > 0")


@dataclass(frozen=True, kw_only=True)
class EnginesConfig:
    """The engine actors: how many, what each reserves, and the host each runs (the job's decode
    ``mode`` is its host's: ``host.mode``)."""

    #: each engine actor's host: engine (vllm|noop, preset, overrides), decode mode, per-page limits, pages
    #: in flight per actor (16), cap on live branches per actor (none)
    host: HostConfig = field(default_factory=HostConfig)
    #: (min, max) engine actors (autoscaled between)
    num_actors: tuple[int, int] = knob((1, 1), flags=("--actors",), parse="range_pair", from_field=tuple,
                                       show=range_text, note="N or MIN,MAX")
    gpus_per_actor: float = 0.0  #: GPUs per engine actor (1 on GPU clusters)
    cpus_per_actor: float = 1.0  #: CPUs per engine actor
    #: custom Ray resources each engine actor asks for, e.g. {"padoc_gpu_node": 1}: engine actors then run
    #: only on nodes started with that resource (``ray start --resources '{"padoc_gpu_node": 2}'`` holds two),
    #: rasterization and writing anywhere. Empty: no custom resource, any node with the CPUs and GPUs
    #: above. CPU, GPU and memory are not custom resources (use cpus_per_actor / gpus_per_actor)
    engine_resources: Mapping[str, float] = knob(factory=dict, parse="resources", metavar="JSON", from_field=dict)
    #: pages per engine-actor call; they run concurrently inside the actor
    batch_pages: int = knob(16, flags=("--engine-batch-pages",))

    def __post_init__(self) -> None:
        lo, hi = self.num_actors
        if not 1 <= lo <= hi:
            raise ValueError(f"actor range must satisfy 1 <= min <= max, got {self.num_actors}")
        if self.batch_pages < 1:
            raise ValueError("engine_batch_pages must be >= 1")
        if self.gpus_per_actor < 0 or self.cpus_per_actor < 0:
            raise ValueError("resources per actor cannot be negative")
        _check_resources(self.engine_resources)


@dataclass(frozen=True, kw_only=True)
class OutputsConfig:
    """How the job writes its Parquet and guards a shared output: file size, writers, the run lock and
    leftovers of killed runs."""

    rows_per_file: int = 64  #: page rows per Parquet file; progress is saved file by file (finer resume)
    writer_cpus: float = 0.1  #: CPUs per Parquet write task (light; do not reserve a core)
    #: unreadable Parquet files under pages/ are skipped; the driver removes those of earlier (killed) runs at
    #: once, files of unknown origin once older than this (seconds), the live run's never
    leftover_grace_s: float = knob(3600.0, flags=("--leftover-grace",), metavar="SECONDS")
    #: when another run holds the output, wait this long for it (seconds; 0: refuse at once, exit code 2)
    lock_wait_s: float = knob(0.0, flags=("--wait-lock",), metavar="SECONDS")
    #: an s3:// output's lock is stale (its run is taken for dead) when its heartbeat is older than this
    lock_stale_s: float = knob(120.0, flags=("--lock-stale",), metavar="SECONDS")
    #: price of one GPU hour (USD): summary.json then gets usd_per_million_pages, from its engine_seconds_per_page
    #: (one engine per GPU). None: no price
    gpu_hour_usd: float | None = None

    def __post_init__(self) -> None:
        if self.writer_cpus <= 0:
            raise ValueError("writer_cpus must be > 0")
        if self.gpu_hour_usd is not None and not (math.isfinite(self.gpu_hour_usd) and self.gpu_hour_usd > 0):
            raise ValueError(f"gpu_hour_usd is a price per GPU hour > 0, got {self.gpu_hour_usd!r}")
        if self.leftover_grace_s < 0 or self.lock_wait_s < 0 or self.lock_stale_s <= 0:
            raise ValueError("leftover_grace_s and lock_wait_s must be >= 0, lock_stale_s > 0")


@dataclass(frozen=True, kw_only=True)
class BatchConfig:
    """The batch job: what to read, where to write, with which model, in four sections (inputs, raster,
    engines, outputs). The decode mode is ``engines.host.mode`` (:attr:`mode`)."""

    input: str  #: folder, glob, s3://bucket/prefix, or a manifest (.txt/.manifest) of URIs
    output: str  #: folder or s3://bucket/prefix; holds pages/, documents/, summary.json
    model: str  #: checkpoint directory, local or s3://
    #: teacher-forced replay: OmniDocBench-format ground truth whose pages (matched by file name
    #: and page_no, see examples/ground_truth.json) force the model's output (tiny-model demos, benchmarks)
    replay_gt: str | None = knob(None, flags=("--replay",), dest="replay", metavar="GT.json")
    storage: StorageConfig = field(default_factory=StorageConfig)  #: how s3:// inputs, outputs and models are reached
    inputs: InputsConfig = field(default_factory=InputsConfig)
    raster: RasterConfig = field(default_factory=RasterConfig)
    engines: EnginesConfig = field(default_factory=EnginesConfig)
    outputs: OutputsConfig = field(default_factory=OutputsConfig)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  #: names this run's files

    def __post_init__(self) -> None:
        if not self.run_id or not all(c.isascii() and (c.isalnum() or c == "-") for c in self.run_id):
            raise ValueError(f"run_id must be letters, digits and '-' (it names the run's files), got {self.run_id!r}")
        if output_inside_input(self.input, self.output):
            raise ValueError(f"--output {self.output} is inside --input {self.input}: every rerun would parse the "
                             f"job's own outputs; choose an output outside the input")

    @classmethod
    def from_flat(cls, **kw) -> "BatchConfig":
        """From the flat layout of ``summary.json``'s ``config`` (:data:`FLAT_KEYS`: ``rows_per_file``,
        ``raster_cpus``, ``mode`` ...): each key goes to its section."""
        top = {k: kw.pop(k) for k in list(kw) if k not in FLAT_KEYS}
        parts: dict[str, dict] = {}
        for k, v in kw.items():
            section, name = FLAT_KEYS[k]
            parts.setdefault(section, {})[name] = v
        if "mode" in parts.get("host", {}):
            mode = parts.pop("host")["mode"]
            engines = parts.setdefault("engines", {})
            engines["host"] = replace(engines.get("host", HostConfig()), mode=mode)
        sections = {"inputs": InputsConfig, "raster": RasterConfig, "engines": EnginesConfig, "outputs": OutputsConfig}
        return cls(**top, **{name: sections[name](**fields) for name, fields in parts.items()})

    def flat(self) -> dict:
        """The flat layout (``summary.json``'s ``config``), values as :func:`dataclasses.asdict` gives them."""
        d = {"input": self.input, "output": self.output, "model": self.model}
        for key, (section, name) in FLAT_KEYS.items():
            v = self.mode if key == "mode" else getattr(getattr(self, section), name)
            d[key] = asdict(v) if is_dataclass(v) else (list(v) if key == "pages" and v is not None else v)
        d.update(replay_gt=self.replay_gt, storage=asdict(self.storage), run_id=self.run_id)
        return d

    @property
    def mode(self) -> str:
        """The job's decode mode: its engine host's (fork or sequential)."""
        return self.engines.host.mode


#: the flat keys of ``summary.json``'s ``config`` (the batch job's settings before they had sections): their
#: section and field
FLAT_KEYS: dict[str, tuple[str, str]] = {
    "mode": ("host", "mode"), "render": ("raster", "render"), "renderer": ("raster", "renderer"),
    "pages": ("inputs", "pages"), "max_pages_per_doc": ("inputs", "max_pages_per_doc"), "host": ("engines", "host"),
    "num_actors": ("engines", "num_actors"), "gpus_per_actor": ("engines", "gpus_per_actor"),
    "cpus_per_actor": ("engines", "cpus_per_actor"), "engine_resources": ("engines", "engine_resources"),
    "raster_cpus": ("raster", "cpus"), "raster_block_mb": ("raster", "block_mb"),
    "raster_docs_per_task": ("raster", "docs_per_task"), "raster_pages_per_block": ("raster", "pages_per_block"),
    "engine_batch_pages": ("engines", "batch_pages"), "image_encoding": ("raster", "encoding"),
    "writer_cpus": ("outputs", "writer_cpus"), "rows_per_file": ("outputs", "rows_per_file"),
    "limits": ("inputs", "limits"), "manifest_allow": ("inputs", "manifest_allow"),
    "follow_symlinks": ("inputs", "follow_symlinks"), "leftover_grace_s": ("outputs", "leftover_grace_s"),
    "lock_wait_s": ("outputs", "lock_wait_s"), "lock_stale_s": ("outputs", "lock_stale_s"),
    "gpu_hour_usd": ("outputs", "gpu_hour_usd"),
}

#: resources Ray sets through their own options, never through a custom resource dict
_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def _check_resources(res: Mapping[str, float]) -> None:
    """A custom resource request: names Ray accepts, amounts > 0 (finite)."""
    if not isinstance(res, Mapping):
        raise ValueError(f"engine_resources must map resource names to amounts, got {res!r}")
    for name, amount in res.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"engine_resources: a resource name must be a non-empty string, got {name!r}")
        if name in _BUILTIN_RESOURCES:
            raise ValueError(f"engine_resources: {name} is not a custom resource; use cpus_per_actor / gpus_per_actor "
                             f"(--cpus-per-actor, --gpus-per-actor)")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount <= 0:
            raise ValueError(f"engine_resources: {name} needs an amount > 0, got {amount!r}")
