"""The experiment's settings, for the root scripts and notebooks: ``SHARED_CONFIG`` and its parsers.

They live in ``reservoir/config.py`` (edit ``SHARED_CONFIG`` there, or override any key on the command
line as ``KEY=VALUE``); this module re-exports them so ``from configs import parse_overrides`` keeps working.
"""

from reservoir.config import (  # noqa: F401
    ADDED_KEYS,
    SHARED_CONFIG,
    ConfigError,
    config_from_argv,
    default_config,
    given_settings,
    help_text,
    key_comments,
    model_blocks,
    parse_literal,
    parse_options,
    parse_overrides,
    recorded_keys_missing,
    split_arguments,
    validate,
    wants_help,
)
