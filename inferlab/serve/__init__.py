"""The course's engine behind an OpenAI-compatible HTTP server: ``python -m inferlab.serve``.

Read in this order: ``protocol`` (the request and response bodies of ``/v1/completions``, and
OpenAI-style errors), ``tenants`` (API keys, per-tenant limits, prefix-cache salts),
``metrics`` (what ``/metrics`` exports to Prometheus), ``shapes`` (the response objects of the
two generation endpoints), ``chat`` (``/v1/chat/completions``: messages through the chat
template into the completion path), ``app`` (the FastAPI application over an
``inferlab.serving.online.OnlineEngine``), ``background`` (running it on a local port inside a
test or a notebook, and stopping it), ``__main__`` (the command line).
"""
