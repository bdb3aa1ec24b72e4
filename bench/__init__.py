"""Benchmarks of txlog's services and SDK: each module measures one thing (most on a
local cluster started for the run) and prints one JSON object to stdout, with its
progress on stderr. Run one as ``python -m bench.NAME`` from the repository root
(``make bench`` runs the main ones); ``bench.measure`` holds what they share.
"""
