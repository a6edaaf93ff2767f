"""Planning a consortium's privacy before it runs: which mechanism and noise fit a
budget, how many queries and teachers (``capc privacy``). Kept apart from
:mod:`capc.privacy`, the accounting, which no mechanism may depend on."""
