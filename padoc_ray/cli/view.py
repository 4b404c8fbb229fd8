"""``view``: a local web app over a batch output (:mod:`padoc_ray.viewer`), or a static report of it."""

from __future__ import annotations

from padoc_ray.cli.common import add_command, die


def cmd_view(args) -> int:
    from padoc_ray.cli.flags import from_args
    from padoc_ray.storage import StorageConfig
    from padoc_ray.viewer.app import ViewerConfig, make_app
    from padoc_ray.viewer.data import ViewerInputError

    cfg, storage = from_args(ViewerConfig, args), from_args(StorageConfig, args)
    if cfg.export:
        from padoc_ray.viewer.data import Output
        from padoc_ray.viewer.export import export
        from padoc_ray.viewer.app import page_images

        try:
            out = Output(args.output, storage)
        except ViewerInputError as e:
            die(str(e))
        info = export(out, page_images(out, cfg, storage), cfg.export, cfg.export_pages)
        print(f"{info['index']}: {info['pages']} page views, {info['errors']} error rows")
        return 0
    try:
        app = make_app(args.output, cfg, storage)
    except ViewerInputError as e:
        die(str(e))
    from padoc_ray.viewer.server import run

    run(app, cfg.host, cfg.port, announce=lambda url: print(f"padoc-ray view: {url}", flush=True),
        header_timeout_s=cfg.header_timeout_s)
    return 0


def register(sub) -> None:
    from padoc_ray.cli.flags import add_fields
    from padoc_ray.storage import StorageConfig
    from padoc_ray.viewer.app import ViewerConfig

    p = add_command(sub, "view", help="browse a batch output in the browser (documents, pages, boxes, Markdown)",
                    description="A local web app over a batch output (local or s3://): the documents table with "
                                "counts, filters and search; each page with its region boxes and its Markdown, "
                                "linked both ways; error rows. With --export DIR, a static HTML report instead.")
    p.add_argument("output", help="the batch job's --output (local folder or s3://)")
    add_fields(p, ViewerConfig, ("host", "port", "allowed_hosts", "header_timeout_s", "source_root", "any_source",
                                 "export", "export_pages"))
    add_fields(p, StorageConfig, ("endpoint",))
    p.set_defaults(func=cmd_view)
