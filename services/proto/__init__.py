"""Generated protobuf and gRPC code for protos/capc/v1 (see generate.py)."""
