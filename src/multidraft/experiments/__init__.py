"""Experiment runners (write JSONL), reports and plots (read JSONL). The only printing layer besides the CLI."""
