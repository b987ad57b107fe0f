"""`sheepop serve`: three rooms, each importing only the ones above it in this list.

    api/         the OpenAI-compatible HTTP server with continuous batching (docs/serve.md)
    documents/   docs/math and docs/derivations rendered as web pages at /docs/, formulas in
                 MathML (docs/page.md, "The mathematics, rendered")
    page/        the teaching page at / and the data of its views (docs/page.md)
"""
