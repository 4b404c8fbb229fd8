"""The page-row format every writer shares (batch job, Serve jobs) and the one way to read it.

``rows``: the page and document schemas, how rows are built, and :func:`~padoc_ray.output.rows.page_from_row`
(a row back to a protocol ``Page``); ``reader``: the one read-only reader of ``pages/*.parquet``; ``commits``: the records that prove
those files complete (written by the batch driver);
``show``: draws a row's boxes on its page. Imports no ray, vllm or torch.
"""
