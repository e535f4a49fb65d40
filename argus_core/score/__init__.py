"""The W1 scoring job (L3): kernel summaries from Prometheus, scored by the core, served back."""
