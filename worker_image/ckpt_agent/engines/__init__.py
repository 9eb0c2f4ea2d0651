"""Engine adapters: what performs the final apply of a version (see docs/architecture.md)."""
