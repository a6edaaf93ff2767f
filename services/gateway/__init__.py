"""The REST gateway: jobs, student models, budgets and admin for people, over the gRPC services."""
