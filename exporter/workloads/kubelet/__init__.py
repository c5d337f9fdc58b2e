"""The kubelet's pod-resources API: gRPC over HTTP/2 on a unix socket, answers bounded
while they are decoded."""
