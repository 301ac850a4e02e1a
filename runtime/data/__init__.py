"""Training data: a byte-level text corpus found on every machine, and synthetic images."""
