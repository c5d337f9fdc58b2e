"""Generated gRPC stubs (see exporter/workloads/kubelet/protogen.py). Do not edit."""
