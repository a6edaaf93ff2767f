"""Offline datasets and partitioning (programmatic query generators come with DIET)."""
