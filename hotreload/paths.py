"""Where a session keeps its socket and state.

The socket lives in a per-user folder only the user can enter (mode 0700), named by a hash
of the config path: Unix socket paths are limited to about 107 bytes, so a socket inside a
deep project folder would fail to bind.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from hotreload.errors import HotreloadError

#: Longest socket path `bind` accepts on Linux (108 bytes including the final NUL).
MAX_SOCKET_PATH = 107


def _runtime_candidates() -> list[Path]:
    """Where this user's sockets and lock files may go, best first: `$XDG_RUNTIME_DIR` (the
    login manager's private folder, when it is ours), `hotreload-<uid>` in the temp folder,
    and a folder in this user's cache (under the home folder: no other user can make it)."""
    out = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
        except OSError:
            st = None
        if (
            st is not None
            and stat.S_ISDIR(st.st_mode)
            and st.st_uid == os.getuid()
            and os.access(runtime, os.W_OK)
        ):
            out.append(Path(runtime) / "hotreload")
    out.append(Path(tempfile.gettempdir()) / f"hotreload-{os.getuid()}")
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    out.append(Path(cache) / "hotreload" / "run")
    return out


def _taken(path: Path) -> str | None:
    """Why `path` cannot be this user's private folder as it stands (None: it can, or it
    does not exist yet): another user made it first, or it is a link or a file."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a plain folder (a symbolic link or a file)"
    if st.st_uid != os.getuid():
        return f"{path} belongs to uid {st.st_uid}, not you (another user made it first)"
    return None


def user_runtime_dir() -> Path:
    """This user's own folder for sockets and lock files: the first of `_runtime_candidates`
    that no one else took. A `hotreload-<uid>` another local user made first in the shared
    temp folder used to stop every session from starting; it is passed over (and said once
    by `runtime_dir_note`). Sessions and clients choose alike, so they meet at one socket.
    When every candidate is taken, the temp one is returned and `ensure_private_dir` refuses
    it, saying why."""
    candidates = _runtime_candidates()
    for path in candidates:
        if _taken(path) is None:
            return path
    return candidates[-2]


def runtime_dir_note() -> str | None:
    """One line when a better place for sockets and locks was passed over (None: none)."""
    chosen = user_runtime_dir()
    for path in _runtime_candidates():
        if path == chosen:
            return None
        why = _taken(path)
        if why is not None:
            return f"{why}; sockets and locks go to {chosen} instead (remove it to use it again)"
    return None


def default_socket_dir() -> Path:
    return user_runtime_dir()


def ensure_private_dir(path: Path, fix: str = "set socket_dir in the config") -> Path:
    """Create `path` with mode 0700, or check an existing one belongs to us and is private.
    `fix` says what to do when it belongs to someone else. An existing folder is never
    chmodded: a config naming a shared one (the system temp folder, 1777) must not make
    it private for everyone else, so one that is not private is refused, with the fix."""
    created = False
    try:
        path.mkdir(mode=0o700, parents=True)
        created = True
    except FileExistsError:
        pass  # checked below, a link (even a dangling one) included
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise HotreloadError(
            f"{path} is not a plain folder (a symbolic link or a file); hotreload never "
            "follows one there: remove it and try again"
        )
    if st.st_uid != os.getuid():
        raise HotreloadError(f"{path} belongs to uid {st.st_uid}, not you; {fix}")
    mode = stat.S_IMODE(st.st_mode)
    if created:
        os.chmod(path, 0o700)  # mkdir's mode passed through the umask
    elif mode & (stat.S_IWOTH | stat.S_ISVTX):
        raise HotreloadError(
            f"{path} is shared (mode {mode:04o}: other users may write there), so hotreload "
            f"keeps no private state in it and leaves its mode alone; name a folder of its "
            f"own (e.g. {path / 'hotreload'}) instead: {fix}"
        )
    elif mode & 0o077 and _hotreloads_own(path):
        os.chmod(path, 0o700)  # as an older hotreload left it: made private, as it is now
    elif mode & 0o077:
        raise HotreloadError(
            f"{path} is readable by other users (mode {mode:04o}); hotreload keeps tracebacks, "
            f"sockets and tokens there: `chmod 700 {path}`, or {fix}"
        )
    return path


_MARKER = "# created by hotreload"


def _hotreloads_own(path: Path) -> bool:
    """A folder hotreload made (by its name, or the `.gitignore` it writes there)."""
    if path.name.startswith((".hotreload", "hotreload")):
        return True
    try:
        return (path / ".gitignore").read_text(encoding="utf-8").startswith(_MARKER)
    except (OSError, UnicodeDecodeError):
        return False


def socket_path_for(config_path: Path, socket_dir: Path | None = None) -> Path:
    """The session socket for a config file (same answer in `serve` and in clients)."""
    digest = hashlib.sha256(str(config_path.resolve()).encode()).hexdigest()[:16]
    folder = socket_dir or default_socket_dir()
    path = folder / f"{digest}.sock"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise HotreloadError(
            f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes; "
            "set a shorter socket_dir in the config"
        )
    return path


def ensure_state_dir(path: Path) -> Path:
    """Create the project's state folder, 0700 (tracebacks and code paths land there), with
    a `.gitignore` of `*` inside (as pytest does for .pytest_cache), so events, snapshots
    and check records never end up in a commit. A symbolic link there is refused."""
    ensure_private_dir(path, "remove it, or set state_dir in the config to a folder of yours")
    marker = path / ".gitignore"
    if not marker.exists():
        try:
            write_private_file(marker, f"{_MARKER}: nothing here belongs in version control\n*\n")
        except (OSError, HotreloadError):
            pass
    return path


def open_private(path: Path, flags: int) -> int:
    """os.open for a file only this user may read (0600, tightened if it was wider); never
    follows a symbolic link (one there is refused: it could point anywhere we may write)."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HotreloadError(
                f"{path} is a symbolic link; hotreload never writes through one: remove it"
            ) from None
        raise
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_private_file(path: Path, text: str) -> None:
    """Replace `path`'s contents with `text`, as `open_private` opens it."""
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def snapshot_root(config_path: Path) -> Path:
    """Where a session keeps its last-good snapshots: outside the project, so copying a
    model's folders never adds inotify watches or events inside the watched tree."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    digest = hashlib.sha256(str(config_path.resolve()).encode()).hexdigest()[:16]
    return Path(cache) / "hotreload" / "snapshots" / digest


#: The HTTP endpoint's bearer token, in the private state folder (`[http] auth = "token"`).
HTTP_TOKEN_FILE = "http_token"


def http_token_path(state_dir: Path) -> Path:
    return state_dir / HTTP_TOKEN_FILE


def read_http_token(state_dir: Path) -> str | None:
    """The session's HTTP token, or None when there is none (or it is not ours alone)."""
    path = http_token_path(state_dir)
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        return path.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def ensure_http_token(state_dir: Path) -> str:
    """The token, made once (0600, 256 random bits) and kept across sessions, so scripts
    that read it keep working after a restart."""
    import secrets

    token = read_http_token(state_dir)
    if token is None:
        ensure_state_dir(state_dir)
        token = secrets.token_urlsafe(32)
        write_private_file(http_token_path(state_dir), token + "\n")
    return token
