"""HACO workers: member execution, LLM backends, simulated backends and network."""
