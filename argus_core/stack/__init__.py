"""The whole Argus stack on one machine: configs, processes, the webhook receiver."""
