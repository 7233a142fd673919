"""Experiments that produce the tables a user reads: ``fedvlr-plus experiment paper-table``
(:mod:`.paper.table` trains and summarises, :mod:`.paper.report` writes and prints the table)."""
