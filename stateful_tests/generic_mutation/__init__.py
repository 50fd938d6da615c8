"""Configuration and oracles for ``kvspec mutants --generic`` (cosmic-ray over impl/)."""
