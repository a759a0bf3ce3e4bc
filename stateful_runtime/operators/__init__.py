"""Operator engines shared by the Spark path and the in-memory test harness."""
