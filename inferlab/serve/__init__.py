"""The course's engine behind an OpenAI-compatible HTTP server: ``python -m inferlab.serve``.

Read in this order: ``protocol`` (the request body of ``/v1/completions`` and the response
objects of both generation endpoints), ``errors`` (OpenAI-style error answers), ``tenants``
(API keys, per-tenant limits, prefix-cache salts), ``logs`` (the startup banner and the
periodic stats line), ``chat`` (``/v1/chat/completions``: messages through the chat template
into a completion body), ``responses`` (``/v1/responses``: the Responses API and its stored
conversations), ``app`` (the FastAPI application over an
``inferlab.serving.online.OnlineEngine``: module-level handlers sharing one parse, one path
through the engine and one error mapping), ``background`` (running it on a local port inside a
test or a notebook, and stopping it), ``__main__`` (the command line). What ``/metrics``
exports to Prometheus is ``inferlab.serving.metrics.ServerMetrics``, beside the TTFT and TPOT
it exports; a request's fields are checked by ``inferlab.validation``, once, when the engine
takes it.
"""
