"""capc: confidential and private collaborative learning for hospital consortia.

The core library holds pure computation only (privacy arithmetic, secure
computation, models, data); the network services live in ``services``.
"""

__version__ = "0.1.0"
