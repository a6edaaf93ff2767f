"""Test beds for load tests, fault tests and benchmarks; no service imports them."""
