"""``get_device_info``: the machine a run would use (the tutorials' name)."""

from engine.device_info import get_device_info

__all__ = ["get_device_info"]
