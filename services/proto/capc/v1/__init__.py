"""Generated code: do not edit; run python -m services.proto.generate."""
