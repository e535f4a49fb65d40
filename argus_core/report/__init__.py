"""Presentation of a diagnosis: the text report and PNG figures (kept out of the statistics)."""
