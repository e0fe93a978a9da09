#!/usr/bin/env bash
# Regenerate the committed stubs from api.proto. Needs grpcio-tools; the committed ones
# came from grpcio-tools 1.85.1 (protobuf gencode 7.35.1), so they need grpcio>=1.85.1 and
# protobuf>=7.35.1 at run time. The proto is registered under its path in the repository,
# so it cannot collide with another "api.proto" in the same process.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
    gpuconsole/sources/tenancy/proto/api.proto
