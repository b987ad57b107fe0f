"""Ingestion: files (text, HTML, code, PDF, images, JSON Lines, Parquet) -> normalised
documents -> tokens. A document is the unit: one per file, or one per line / row.

One module per format (text, html, pdf, image, jsonl, parquet; code is text with its language
from filetypes), plus discovery (the walk), extract (one file's documents, in a worker), store
(scratch text on disk), doctable (the kept documents, dedup), tokenizing (ids in workers),
report (the summary), pipeline (`prepare`, the whole run) and collect (the same readers for
`sheepop train FILE|FOLDER`, in memory). See docs/data.md.
"""

from sheepop.data.ingest.pipeline import PrepareOptions, PrepareResult, prepare

__all__ = ["PrepareOptions", "PrepareResult", "prepare"]
