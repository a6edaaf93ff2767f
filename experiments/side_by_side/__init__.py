"""Side by side: what a hospital gets from capc against what it would do instead
(issue 43). One split per dataset, every method on it, the same test records.

``data``: the splits; ``baselines``: training alone, pooled, DP-SGD on pooled data
and DP-FedAvg; ``capc_runs``: the DIET student, the CaPC loop and PATE with public
data through capc; ``__main__``: the grid and its saved rows.
"""
