"""Prometheus text exposition: the only package that writes metric text.

Data flows one way: nvml/ and kube/ return readings and plain records, the
poller publishes a Snapshot, and :mod:`exporter.exposition.build` turns it into
the bytes /metrics serves (text.py formats, dcgm.py and pods.py lay out the
families, xid.py counts XIDs, selfmetrics.py reports the exporter itself).
"""
