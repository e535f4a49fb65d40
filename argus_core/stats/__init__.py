"""Statistics for fail-slow diagnosis: grouping, KDE valley compression, mixtures, W1, robust
fences and change points. Everything is vectorised over groups; no per-event Python objects."""
