"""The coordinator service: the OpenAI-compatible HTTP API behind `haco serve`."""
