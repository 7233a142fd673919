"""Experiments that produce the tables a user reads: ``fedvlr-plus experiment paper-table``
(:mod:`.paper_table` trains and summarises, :mod:`.paper_report` writes and prints the table)."""
