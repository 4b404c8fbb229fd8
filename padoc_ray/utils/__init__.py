"""Small shared helpers with no padoc-specific knowledge."""
