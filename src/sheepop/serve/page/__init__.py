"""The teaching page at / of `sheepop serve` (docs/page.md): its static files and the data of
its views.

    routes.py         every route of the page: /, /static/, the documents' /docs/, the views'
    inside_view.py    POST /v1/inspect: the Inside view (attention, top tokens, logit lens)
    step_view.py      POST /v1/trace: the Step view (one token through every step of docs/math)
    backprop_view.py  POST /v1/backward: the Backprop view (one training step's gradients)
    patch_view.py     POST /v1/patch: the Patching view (activation patching's grid, its
                      estimate, the direct logit attribution)
    view_endpoint.py  what the Step, Backprop and Patching views' endpoints share: the body
                      read and checked, the computation on the scheduler's thread, the timing
    runs_view.py      GET /v1/runs: the Runs view (the runs under --runs, their curves)
    static/           the page's HTML, scripts and style, written here (no CDN, no framework)
"""
