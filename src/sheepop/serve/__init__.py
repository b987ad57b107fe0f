"""An OpenAI-compatible HTTP server with continuous batching (`sheepop serve`, docs/serve.md).

    protocol.py   request bodies -> checked requests, or OpenAI's error JSON
    choice.py     one request's sequences: sampling, text, stop strings, log-probabilities
    scheduler.py  the thread that owns the model: the continuous-batching loop
    render.py     events -> OpenAI's response and stream shapes
    respond.py    a request's response, whole or streamed, cancelled when the client leaves
    app.py        the ASGI app (Starlette): routes, API key, body limit, errors
    server.py     uvicorn: the socket, the ready line, a graceful stop on SIGINT/SIGTERM
"""
