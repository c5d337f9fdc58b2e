"""The Kubernetes API server: this node's pods and DRA ResourceSlices, listed and watched."""
