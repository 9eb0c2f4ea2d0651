"""What every layer of the agent stands on: error types, metrics, log format."""
