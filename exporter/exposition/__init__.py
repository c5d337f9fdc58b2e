"""Prometheus text exposition: the only package that writes metric text.

Data flows one way: the collector's Snapshot and workloads/' records go through the
derive stage (exporter/derive/stage.py), which hands over a frozen Frame
(exporter/frame.py); :mod:`exporter.exposition.build` turns it into the bytes /metrics
serves (text.py formats, dcgm.py and pods.py lay out the families, accounting.py the
accounting ones, selfmetrics.py reports the exporter itself). Nothing here advances
state or imports workloads/ or derive/: what is kept across cycles is text.
"""
