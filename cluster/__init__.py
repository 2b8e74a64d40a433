"""Ray connection and cluster helpers."""
