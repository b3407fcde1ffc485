"""Train and compare reservoir LMs and baseline LMs on TinyStories.

    python TinyStories.py [KEY=VALUE ...]      # keys: python TinyStories.py --help

Reads top to bottom: config -> device -> data -> models -> results -> plots.
"""

import sys

from configs import apply_device_adjustments, config_from_argv
from reservoir import device as dev


def main(argv: list[str]) -> int:
    config = config_from_argv(argv)
    try:
        info = dev.select_device(config)
    except dev.DeviceError as e:
        raise SystemExit(f"error: {e}") from None
    dev.enable_transparent_hugepages(info)
    config = apply_device_adjustments(config, info.kind)
    print(info.banner(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
