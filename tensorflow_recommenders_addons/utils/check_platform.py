"""Which system and machine this is, under TFRA's names, for code that picks its tests or
settings by platform.

Example:
    from tensorflow_recommenders_addons.utils.check_platform import is_macos, is_arm64
    use_half = not (is_macos() and is_arm64())
"""

import platform


def is_macos():
    return platform.system() == "Darwin"


def is_windows():
    return platform.system() == "Windows"


def is_linux():
    return platform.system() == "Linux"


def is_arm64():
    """An Apple-silicon style arm64 machine (Linux reports aarch64, which is not arm64 here)."""
    return platform.machine() == "arm64"


def is_raspi_arm():
    return platform.machine() == "armv7l"
