"""The batch job's configuration: one dataclass, validated, with documented defaults."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Mapping

from padoc_ray.host import HostConfig
from padoc_ray.pdf import RenderConfig
from padoc_ray.pipeline.limits import InputLimits
from padoc_ray.storage import StorageConfig, output_inside_input
from padoc_ray.raster import ENCODINGS, RendererConfig


@dataclass(frozen=True, kw_only=True)
class BatchConfig:
    input: str  #: folder, glob, s3://bucket/prefix, or a manifest (.txt/.manifest) of URIs
    output: str  #: folder or s3://bucket/prefix; holds pages/, documents/, summary.json
    model: str  #: checkpoint directory, local or s3://
    mode: str = "fork"  #: fork (PaDoc) or sequential (baseline)
    render: RenderConfig = field(default_factory=RenderConfig)
    #: rendering deadlines and crash isolation (per page 120 s, per document 600 s, own process)
    renderer: RendererConfig = field(default_factory=RendererConfig)
    pages: tuple[int, ...] | None = None  #: 0-based page indices to parse (None: all)
    max_pages_per_doc: int | None = None  #: parse at most this many pages of each document
    #: each engine actor's host: engine (vllm|noop, preset, overrides), per-page limits, pages in flight
    #: per actor (16), cap on live branches per actor (none). Its ``mode`` is ignored: ``mode`` above rules
    host: HostConfig = field(default_factory=HostConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    # engine actors
    num_actors: tuple[int, int] = (1, 1)  #: (min, max) engine actors (autoscaled between)
    gpus_per_actor: float = 0.0  #: 1 on GPU clusters
    cpus_per_actor: float = 1.0
    #: custom Ray resources each engine actor asks for, e.g. {"padoc_gpu_node": 1}: engine actors then run
    #: only on nodes started with that resource (``ray start --resources '{"padoc_gpu_node": 2}'``), while
    #: rasterization and writing run anywhere. Empty (default): no custom resource, any node with the CPUs
    #: and GPUs above. CPU, GPU and memory are not custom resources (use cpus_per_actor / gpus_per_actor)
    engine_resources: Mapping[str, float] = field(default_factory=dict)
    #: teacher-forced replay: OmniDocBench-format ground truth whose pages (matched by file name
    #: and page_no, see examples/ground_truth.json) force the model's output (tiny-model demos, benchmarks)
    replay_gt: str | None = None
    # rasterization
    #: CPUs Ray reserves per rasterization task. A task's own process mostly waits on its renderer
    #: process and Ray Data keeps part of the CPU budget for later stages, so 0.25 keeps every core
    #: rendering (measured: steady no-op pipeline 237 pages/s at 0.25 vs 142 at 0.5 on 2 cores)
    raster_cpus: float = 0.25
    raster_block_mb: int = 16  #: target size of blocks of rendered pages (bounds memory in flight)
    #: input files per rasterization task; None: up to 8, fewer when there are few files per CPU (small
    #: files then share Ray's per-task cost; a large document still streams page by page)
    raster_docs_per_task: int | None = None
    raster_pages_per_block: int = 16  #: rendered pages per output block of the raster stage
    engine_batch_pages: int = 16  #: pages per engine-actor call (they run concurrently in the actor)
    #: how rendered pages travel to the engine actors, all lossless: "zstd" (raw pixels + zstd level 1:
    #: ~3 ms to encode, as small as PNG), "png" (~33 ms to encode) or "ppm" (uncompressed)
    image_encoding: str = "zstd"
    writer_cpus: float = 0.1  #: CPUs per Parquet write task (light; do not reserve a core)
    rows_per_file: int = 64  #: page rows per Parquet file: smaller files = finer-grained resume
    # hostile inputs and shared outputs
    limits: InputLimits = field(default_factory=InputLimits)  #: caps per input (pages, frames, bytes)
    #: prefixes (folders, s3://bucket/prefix) a manifest --input may name; empty: the manifest's own folder
    manifest_allow: tuple[str, ...] = ()
    #: follow symbolic links in an --input folder, only to targets inside it (False: each link is a
    #: row with status symlink, never read; see padoc_ray.storage.list_inputs)
    follow_symlinks: bool = False
    #: unreadable Parquet files under pages/ that no run's name claims are removed by the driver once
    #: older than this (seconds; an earlier run's are removed at once, the live run's never)
    leftover_grace_s: float = 3600.0
    lock_wait_s: float = 0.0  #: wait this long for another run's lock on the output (0: refuse at once)
    #: an s3:// output's lock is stale (its run is taken for dead) when its heartbeat is older than this
    lock_stale_s: float = 120.0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        if self.mode not in ("fork", "sequential"):
            raise ValueError(f"mode must be fork or sequential, got {self.mode!r}")
        lo, hi = self.num_actors
        if not 1 <= lo <= hi:
            raise ValueError(f"actor range must satisfy 1 <= min <= max, got {self.num_actors}")
        if self.image_encoding not in ENCODINGS:
            raise ValueError(f"image_encoding must be one of {', '.join(ENCODINGS)}, got {self.image_encoding!r}")
        docs_per_task = 1 if self.raster_docs_per_task is None else self.raster_docs_per_task  # 0 is not "auto"
        if self.raster_pages_per_block < 1 or self.engine_batch_pages < 1 or docs_per_task < 1:
            raise ValueError("raster_docs_per_task, raster_pages_per_block and engine_batch_pages must be >= 1")
        if self.max_pages_per_doc is not None and self.max_pages_per_doc < 1:
            raise ValueError("max_pages_per_doc must be >= 1")
        if self.gpus_per_actor < 0 or self.cpus_per_actor < 0:
            raise ValueError("resources per actor cannot be negative")
        _check_resources(self.engine_resources)
        if self.raster_cpus <= 0 or self.writer_cpus <= 0:
            raise ValueError("raster_cpus and writer_cpus must be > 0")
        if self.leftover_grace_s < 0 or self.lock_wait_s < 0 or self.lock_stale_s <= 0:
            raise ValueError("leftover_grace_s and lock_wait_s must be >= 0, lock_stale_s > 0")
        if not self.run_id or not all(c.isascii() and (c.isalnum() or c == "-") for c in self.run_id):
            raise ValueError(f"run_id must be letters, digits and '-' (it names the run's files), got {self.run_id!r}")
        if output_inside_input(self.input, self.output):
            raise ValueError(f"--output {self.output} is inside --input {self.input}: every rerun would parse the "
                             f"job's own outputs; choose an output outside the input")


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
