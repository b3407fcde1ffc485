__version__ = "0.4.0"  # pyproject.toml's; recorded in every config.json (results.versions)
