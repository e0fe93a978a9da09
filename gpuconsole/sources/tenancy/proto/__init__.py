"""Generated gRPC stubs of the kubelet pod-resources API v1 (see api.proto)."""
