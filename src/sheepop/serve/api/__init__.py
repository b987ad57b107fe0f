"""An OpenAI-compatible HTTP server with continuous batching (`sheepop serve`, docs/serve.md).

    protocol.py         request bodies -> checked requests, or OpenAI's error JSON
    choice.py           one request's sequences: sampling, text, stop strings, log-probabilities
    scheduler.py        the thread that owns the model: the continuous-batching loop
    response_shapes.py  events -> OpenAI's response and stream shapes
    respond.py          a request's response, whole or streamed, cancelled when the client leaves
    json_out.py         JSON out: finite numbers, bounded nesting
    origin.py           which pages may call the API (Host and Origin checked)
    app.py              the ASGI app (Starlette): routes, API key, body limit, errors
    connections.py      each connection's limits: slow clients, header sizes, idle time
    file_limit.py       an answer for every connection at the open-file limit
    server.py           uvicorn: the socket, the ready line, a graceful stop on SIGINT/SIGTERM
"""
