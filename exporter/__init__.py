"""specdec: live speculative-decoding payoff for vLLM, per route."""

__version__ = "0.1.0"
