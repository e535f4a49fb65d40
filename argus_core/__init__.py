"""Argus core: schema v1, statistics, L1-L3 diagnosis, simulator and CLI.

Importing this package is cheap: heavy dependencies (scipy, matplotlib, rich) load only in the
modules that need them.
"""

__version__ = "0.1.0"
