"""Development helpers (not in the image): the one /opt/ml tree writer and the demos."""
