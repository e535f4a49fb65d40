"""Progressive fail-slow detection: L1 iteration time, L2 straggler rank and phase, L3 kernel."""
