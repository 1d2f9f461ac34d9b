"""Helpers the tests import (`from support.<module> import ...`: pytest puts
tests/ on sys.path for its rootdir conftest) and the scripts they run in fresh
processes (`python -m tests.support.<module>` from the repository root)."""
