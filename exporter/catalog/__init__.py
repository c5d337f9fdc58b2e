"""The metrics file (dcgm-exporter's CSV) and the field names each dcgm-exporter release serves."""
