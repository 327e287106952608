"""posbias: how an LLM's accuracy depends on where a question sits in a long prompt."""
