"""Dumb widgets: each holds one reactive and paints it; none reads the engine."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import DataTable

from hotreload.tui.fit import column_widths


class Panel(Widget):
    """A bordered panel that shows one rendered view; repaints only when the view changes."""

    view: reactive[Text] = reactive(Text, layout=True)

    class Resized(Message):
        """The panel's size changed: a view laid out for the old size must be made again."""

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="panel")
        self.border_title = title

    def render(self) -> Text:
        return self.view

    def on_resize(self, event: events.Resize) -> None:
        # A layout pass can settle after the last sample was drawn (a column one cell
        # narrower): without this, a line made to fit the old width wraps until the next.
        self.post_message(self.Resized())


class StatusLine(Widget):
    """The one-line header: config, watcher state, load generator, clock."""

    view: reactive[Text] = reactive(Text)

    def render(self) -> Text:
        return self.view


class RowsTable(DataTable[Any]):
    """A table whose rows are one reactive tuple (`view`); unchanged rows cost nothing.

    With `follow_newest`, a new row at the top takes the cursor (the newest reload is the
    one a user wants to see); otherwise the cursor stays on the row it was on.
    """

    view: reactive[tuple[tuple[Any, ...], ...]] = reactive((), always_update=False)

    def __init__(
        self,
        title: str,
        columns: tuple[str, ...],
        *,
        follow_newest: bool = False,
        cursor: bool = True,
        id: str | None = None,
    ) -> None:
        super().__init__(
            id=id, cursor_type="row" if cursor else "none", zebra_stripes=False, classes="panel"
        )
        self.border_title = title
        self._columns = columns
        self.follow_newest = follow_newest

    def on_mount(self) -> None:
        self.add_columns(*self._columns)

    def show(self, rows: tuple[tuple[Any, ...], ...], columns: tuple[str, ...]) -> None:
        """New rows under `columns`: a table fitted to its width drops a column that no
        longer fits, and takes it back when the terminal grows."""
        if columns == self._columns:
            self.view = rows
            return
        self._columns = columns
        old = self.view
        self.set_reactive(RowsTable.view, rows)
        self.watch_view(old, rows)  # the rows may be equal: the columns changed all the same

    def inner_width(self, rows: int) -> int:
        """The cells each of `rows` rows may use: inside border and padding, and beside the
        scroll bar that appears once the rows and the header overflow the height."""
        width, height = self.content_size
        return width - (self.styles.scrollbar_size_vertical if rows + 1 > height else 0)

    def watch_view(
        self, old: tuple[tuple[Any, ...], ...], new: tuple[tuple[Any, ...], ...]
    ) -> None:
        row = self.cursor_row
        grew = len(new) > len(old)
        # Columns too: their widths then fit today's cells, not the widest ever seen. Set
        # here, not measured later by the table: it measures when its own message queue
        # next runs dry, and a frame drawn before that stays cached with the headings'
        # widths, each cell cut to its heading ("v3" of "v3 d513bd5d", "servi") until the
        # rows change again.
        self.clear(columns=True)
        for label, width in zip(self._columns, column_widths(self._columns, new), strict=True):
            self.add_column(label, width=width)
        self.add_rows(new)
        if not new:
            return
        if self.follow_newest and grew:
            row = 0
        self.move_cursor(row=min(max(row, 0), len(new) - 1), animate=False)


def set_border(widget: Any, *, title: str | None = None, subtitle: str | None = None) -> None:
    """Set a border's title or subtitle, only when it changes."""
    # Setting a border text repaints the widget even when it is unchanged; twice a second
    # for every panel that is most of an idle dashboard's drawing.
    if title is not None and widget.border_title != title:
        widget.border_title = title
    if subtitle is not None and widget.border_subtitle != subtitle:
        widget.border_subtitle = subtitle
