"""Helpers shared by the test modules: workspaces, servers, R references, synthetic designs and tables."""
