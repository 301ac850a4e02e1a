"""The fuzz tier: hostile recipes, plans, markets, events and state files through the CLI."""
