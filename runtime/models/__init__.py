"""Built-in models: shapes in specs.py; torch modules are built by the runtime."""
