"""Who uses which device: pods (kubelet and API server), containers outside Kubernetes, HPC jobs."""
