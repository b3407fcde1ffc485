"""ReservoirNLP: reservoir LMs and baseline LMs trained side by side and compared fairly.

The package is grouped by the stage of a result's life, each floor importing only from those below it:
``platform`` (device, machine, signals, files, messages), ``data`` (corpora, tokenizers, tokens),
``models``, ``config`` (the settings), ``run`` (one run and its records), ``studies`` (many runs read
together) and ``studies.frontier`` (the fair frontier).
"""

__version__ = "0.4.0"  # pyproject.toml's; recorded in every config.json (run.writer.versions)
