"""docs/math and docs/derivations as web pages at /docs/ (docs/page.md, "The mathematics,
rendered").

    shown.py      which pages and pictures are shown, and where they are read from
    markdown.py   Markdown and TeX to HTML and MathML
    routes.py     GET /docs/{path}: a page in the page's style, or a picture
"""
