"""Ingestion: a folder of text, HTML, code, PDFs and images -> normalised documents -> tokens.

One module per format (text, html, pdf, image; code is text with its language from
filetypes), plus discovery (the walk), extract (one file in a worker), store (scratch text on
disk), tokenizing (ids in workers), report (the summary) and pipeline (`prepare`, the whole
run). See docs/data.md.
"""

from sheepop.data.ingest.pipeline import PrepareOptions, PrepareResult, prepare

__all__ = ["PrepareOptions", "PrepareResult", "prepare"]
