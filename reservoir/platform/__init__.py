"""What a run stands on: the device (TPU, GPU or CPU, and how to drive it), the machine's load, stopping
on a signal, files written whole, and the one-line messages people read."""

from reservoir.platform import device, stopping
from reservoir.platform.device import DeviceError, DeviceInfo, get_device, select_device
from reservoir.platform.files import StorageError, atomic_write, atomic_write_text
from reservoir.platform.machine import MachineLoad
from reservoir.platform.messages import TAG, OneLineError, progress, say, warn

__all__ = ["device", "stopping", "DeviceError", "DeviceInfo", "get_device", "select_device", "StorageError",
           "atomic_write", "atomic_write_text", "MachineLoad", "TAG", "OneLineError", "progress", "say", "warn"]
