"""Data the demo ships (not code): its pretrained body ``demo-body.pt`` and the record of
how it was made, ``demo-body.json`` (``make demo-body`` remakes both)."""
