"""Engine adapters: what performs the final apply of a version (see ARCHITECTURE.md)."""
