"""The terminal driver the dashboard runs on: Textual's own, leaving a blank screen behind.

Leaving the alternate screen should give back the terminal as it was before the dashboard.
Some terminals keep part of the alternate screen instead: tmux 3.3, after the window grew
while the dashboard ran (80x24 to 120x36, say), keeps the rows the main screen lacked, so
the top of the last frame stayed above "stopping ... stopped". Clearing the alternate
screen just before leaving it leaves nothing to keep, on every terminal.
"""

from __future__ import annotations

from textual.driver import Driver

#: Plain attributes, cursor home, erase the screen: written just before the alternate
#: screen is left.
CLEAR_BEFORE_LEAVING = "\x1b[0m\x1b[H\x1b[2J"


def clean_exit_driver(base: type[Driver]) -> type[Driver]:
    """`base` (Textual's driver for this platform) that clears the screen as it stops."""
    from textual.drivers.linux_driver import LinuxDriver

    if not issubclass(base, LinuxDriver):
        return base  # Windows, or a driver named in TEXTUAL_DRIVER: left as it is

    class CleanExitDriver(base):  # type: ignore[misc, valid-type]
        def stop_application_mode(self) -> None:
            self.write(CLEAR_BEFORE_LEAVING)
            super().stop_application_mode()

    return CleanExitDriver
