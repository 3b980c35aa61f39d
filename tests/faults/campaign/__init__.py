"""The seeded fault campaign (``./dev campaign``, ``python -m tests.faults.campaign``).

Each seed draws a schedule (:mod:`.schedule`, pure: cluster shape, flows of front doors,
faults at offsets), runs it on real servers behind Toxiproxy (:mod:`.run` for classic
clusters, :mod:`.fork` for the Youzan fork; front doors in :mod:`.doors`, faults in
:mod:`.faults`) and checks the invariants of docs/guarantees.md once it settles.

It lives under tests/faults, not bench/, because it is a test: it asserts invariants rather
than measuring, and it builds on the fault suites' harness (settings, clients, keyed book,
toxics) and compat's proxied clusters.
"""
