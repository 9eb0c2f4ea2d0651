"""The checkpoint source, a component of its own: `publish` (write a version with its manifest)
and `serve` (the HTTP/Mooncake source server)."""
