"""Test beds for load tests, fault tests and benchmarks, and the fork server that starts
processes of a local consortium quickly (services.harness: tests, `capc up`, the demo).
No role (guardian, answering party, student, gateway) imports them."""
