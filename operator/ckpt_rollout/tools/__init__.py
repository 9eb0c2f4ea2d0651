"""User tools: the CLI verbs (status, watch, promote, abort, release), the web dashboard, the
trainer's client, and the views they share. Never imported by the controller."""
