"""Fault injection against a local cluster, checked after Jepsen's Kafka workload.

``history`` (what the workers asked and were answered), ``worker`` (the
workload's processes), ``faults`` (the nemesis), ``checker`` (pure functions
over the histories and the final reads), ``run`` (one run end to end, behind
``txlog chaos run``).
"""
