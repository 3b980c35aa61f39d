"""Benchmarks for smartnsq against a real nsqd and peer Python NSQ clients.

Each benchmark (``bench.publish``, ``bench.consume``) runs every client
driver from ``bench/drivers/`` as its own subprocess, in that client's own
virtualenv, and writes raw JSON into ``bench/results/``; ``bench.summarize``
turns the JSON into a section of ``BENCHMARKS.md``.
"""
