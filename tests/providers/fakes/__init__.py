"""Offline clouds for tests: a routed fake HTTP adapter and real Azure/GCP SDK clients over it."""
