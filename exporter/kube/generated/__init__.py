"""Generated gRPC stubs (see exporter/kube/protogen.py). Do not edit."""
