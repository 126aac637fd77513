"""A load generator for any OpenAI-compatible server: ``python -m inferlab.loadgen``.

Read in this order: ``client`` (the requests of a trace, sent at their arrival times, each
streamed and timed token by token), ``report`` (Chapter 4's metrics from those times: the
table, the JSON file and the latency-throughput plot), ``__main__`` (the command line).
"""
