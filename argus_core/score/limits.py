"""The bounds of each query the scorer makes, in one import-light module (the CLI reads its
defaults without loading numpy)."""

DEFAULT_TIMEOUT_S = 30.0  # deadline of one query attempt: connect, send, the whole answer
# Longest answer read per query. The scorer fetches kernel summaries one peer set at a time;
# a peer set of 2,000 ranks x 100 kernels (10,000 ranks, pp=5) answers about 170 MB.
DEFAULT_MAX_ANSWER_BYTES = 256 << 20
