"""The maths pages as web pages: GET /docs/{path} (docs/page.md, "The mathematics, rendered").

    GET /docs/math/04-attention.md    the page, rendered (documents.markdown) into a whole HTML
                                      page in the page's style, its formulas in MathML
    GET /docs/images/attention.png    a picture one of the pages shows
    GET /docs/math/, /docs/math       redirected to the folder's index.md

A page's URL is its path under docs/, so the links between pages resolve as they do on GitHub:
a link to a page that is shown (sheepop.serve.documents.shown) goes there, anchor kept; a link to
anything else (source files, other docs) is shown as its text, titled with the file's path in
the repository, never a link to a 404. Everything is local: the pages work offline.
"""

from __future__ import annotations

import posixpath
from functools import lru_cache
from html import escape
from pathlib import Path

from starlette.requests import Request as HttpRequest
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from sheepop.serve.api.protocol import ApiError
from sheepop.serve.documents import shown
from sheepop.serve.documents.markdown import render

_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · sheepop</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/page.css">
</head>
<body class="doc">
<header>
  <h1><a href="/">sheepop</a></h1>
  <nav class="doc-nav" aria-label="Documents">{nav}</nav>
</header>
<main class="doc-page">
<article>
{body}
</article>
<p class="doc-source">docs/{path}, rendered by <code>sheepop serve</code>: formulas in MathML,
links between the pages kept, links to files of the repository shown as their names.</p>
</main>
</body>
</html>
"""


def html_page(docs: Path, path: str) -> str:
    """The page at `path` under `docs` ("math/04-attention.md") as a whole HTML document."""
    served = set(shown.pages(docs))

    def resolve(target: str, image: bool) -> str | None:
        file, hash_, fragment = target.partition("#")
        if not file:
            return target
        where = posixpath.normpath(posixpath.join(posixpath.dirname(path), file))
        if where in served and not image:
            return f"/docs/{where}{hash_}{fragment}"
        if image and where.startswith("images/") and (docs / where).is_file():
            return f"/docs/{where}"
        return None

    def outside(target: str) -> str:
        where = posixpath.normpath(posixpath.join("docs", posixpath.dirname(path), target))
        return f"{where} in sheepop's repository"

    page = render((docs / path).read_text(encoding="utf-8"), resolve, outside)
    links = [("/", "the page"), ("/docs/math/index.md", "the mathematics")]
    if "derivations/index.md" in served:
        links.append(("/docs/derivations/index.md", "derivations"))
    here = f"/docs/{path}"
    nav = "".join(f'<a href="{url}"' + (' aria-current="page"' if url == here else "")
                  + f">{name}</a>" for url, name in links)
    return _TEMPLATE.format(title=escape(page.title or path), nav=nav, body=page.html,
                            path=escape(path))


@lru_cache(maxsize=64)
def _cached(docs: Path, path: str, mtime: float, shown: tuple[str, ...]) -> str:
    """html_page, again only when the page changed or the set of pages did (its links)."""
    return html_page(docs, path)


async def document(request: HttpRequest) -> Response:
    path = request.path_params["path"]
    docs = shown.root()
    pages = shown.pages(docs)
    folder = path.strip("/")
    if folder in shown.FOLDERS and f"{folder}/index.md" in pages:
        return RedirectResponse(f"/docs/{folder}/index.md", status_code=308)
    if path in pages:
        html = _cached(docs, path, (docs / path).stat().st_mtime, tuple(pages))
        return HTMLResponse(html, headers={"cache-control": "no-cache"})
    if path.startswith("images/") and path in shown.pictures(docs):
        return FileResponse(docs / path)
    raise ApiError(404, f"no document docs/{path[:80]} here: the server shows docs/math/, "
                        "docs/derivations/ and the pictures they show", code="not_found")


ROUTES = [Route("/docs/{path:path}", document, methods=["GET"])]
