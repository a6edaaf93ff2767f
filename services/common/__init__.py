"""Pieces every service shares: PKI, TLS credentials, interceptors, configuration."""
