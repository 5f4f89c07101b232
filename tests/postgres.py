"""A real PostgreSQL server for the tests (DESIGN §10, B3): one per pytest session.

`PostgresServer` takes the machine's PostgreSQL binaries (`initdb`, `pg_ctl`, `postgres`: on
PATH, else the newest /usr/lib/postgresql/*/bin), makes a cluster in a temporary directory,
starts it on a free loopback port with durability off (tests need no crash safety), and hands
out fresh empty databases as libpq URLs. `make test` installs the binaries when they are absent.

initdb and postgres refuse to run as root. When the tests run as root, the cluster belongs to an
unprivileged OS user (`nobody` unless BC_TEST_PG_OS_USER names another): the temporary directory
is created by root and chowned to that user, and every PostgreSQL command is started with
`subprocess`'s own `user=`/`group=`/`extra_groups=` (setgroups, setgid, setuid in the child
between fork and exec; no preexec_fn, so it is safe in a threaded pytest process, and no
runuser/setpriv/sudo is needed). The postmaster that `pg_ctl` forks inherits those ids. When
the tests do not run as root, everything simply runs as the current user.

The cluster is made with `--locale=C --encoding=UTF8` so text sorts by bytes, as SQLite's
default BINARY collation does (ORDER BY on ids gives the same order on both backends), and
`--auth=trust` on the loopback address only, so no password is needed or logged.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

REQUIRED = ("initdb", "pg_ctl", "postgres")
SEARCH_GLOBS = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin")
SUPERUSER = "postgres"  # the database role initdb makes; the OS user may be named otherwise
SERVER_SETTINGS = (
    "listen_addresses=127.0.0.1",
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "max_connections=200",  # several daemon replicas with their pools in one test
)


class PostgresUnavailable(RuntimeError):
    """PostgreSQL could not be found or started: the message says why and what to do."""


def _version_key(bindir: Path) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", str(bindir))
    return tuple(int(n) for n in numbers) or (0,)


def find_bindir() -> Path:
    """The directory holding initdb, pg_ctl and postgres: PATH first, then the newest install."""
    on_path = [shutil.which(name) for name in REQUIRED]
    if all(on_path):
        # Debian's /usr/local/bin entries are symlinks into /usr/lib/postgresql/N/bin; resolve
        # them so the three come from one installation.
        dirs = {Path(p).resolve().parent for p in on_path if p}
        if len(dirs) == 1:
            return dirs.pop()
    candidates = [
        Path(d)
        for pattern in SEARCH_GLOBS
        for d in sorted(Path("/").glob(pattern.lstrip("/")))
        if all((Path(d) / name).is_file() for name in REQUIRED)
    ]
    if candidates:
        return max(candidates, key=_version_key)
    if all(on_path):  # three on PATH from different places: use them as found
        return Path(on_path[0] or "").parent
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in "
        "/usr/lib/postgresql/*/bin; run `make test`, which installs them "
        "(apt-get install postgresql), or install PostgreSQL by hand"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _traversable_by_others(path: Path) -> bool:
    """Whether every directory from / down to path can be entered by any user."""
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in [path, *path.parents])


PREFIX = "bc-pg-"
OWNER_FILE = "owner.pid"  # the test process that made the cluster, to clean up after a kill -9
MIN_TMPFS_FREE = 1 << 30


def choose_parent(as_root: bool) -> Path:
    """Where the cluster lives: BC_TEST_PG_DIR, else /dev/shm when it has room, else TMPDIR.

    tmpfs matters on this kind of machine: CREATE DATABASE + DROP DATABASE measured ~11 ms on
    /dev/shm against 100-350 ms on the virtual disk (file creation and unlink, even with fsync
    off). Dropped databases give their memory back, so the footprint stays at tens of MB.
    """
    chosen = os.environ.get("BC_TEST_PG_DIR")
    if chosen:
        return Path(chosen)
    shm = Path("/dev/shm")
    with contextlib.suppress(OSError):
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize >= MIN_TMPFS_FREE and os.access(shm, os.W_OK | os.X_OK):
            return shm
    parent = Path(tempfile.gettempdir())
    if as_root and not _traversable_by_others(parent):
        parent = Path("/tmp")
    return parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(parent: Path) -> None:
    """Stop and remove clusters left by test processes that died without their teardown."""
    for base in parent.glob(f"{PREFIX}*"):
        try:
            owner = int((base / OWNER_FILE).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # not ours, or being made right now
        if _alive(owner):
            continue
        pidfile = base / "data" / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            postmaster = int(pidfile.read_text().split()[0])
            if _alive(postmaster):
                os.kill(postmaster, signal.SIGQUIT)  # immediate shutdown, like pg_ctl -m immediate
                deadline = time.monotonic() + 5
                while _alive(postmaster) and time.monotonic() < deadline:
                    time.sleep(0.05)
        shutil.rmtree(base, ignore_errors=True)


class PostgresServer:
    """One throwaway PostgreSQL cluster; start() once, new_database() per test, stop() at the end."""

    def __init__(
        self,
        bindir: Path | None = None,
        os_user: str | None = None,
        settings: Sequence[str] = SERVER_SETTINGS,
    ) -> None:
        self.bindir = bindir or find_bindir()
        self.settings = tuple(settings)
        self.as_root = os.geteuid() == 0
        if self.as_root:
            name = os_user or os.environ.get("BC_TEST_PG_OS_USER") or "nobody"
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root, PostgreSQL needs an unprivileged OS user; {name!r} does "
                    "not exist (set BC_TEST_PG_OS_USER to one that does)"
                ) from None
            if entry.pw_uid == 0:
                raise PostgresUnavailable(f"OS user {name!r} is root; PostgreSQL refuses it")
        else:
            entry = pwd.getpwuid(os.geteuid())
        self.os_user = entry.pw_name
        self.uid = entry.pw_uid
        self.gid = entry.pw_gid
        self.port = 0
        self.base: Path | None = None
        self.timings: dict[str, float] = {}
        self._names = itertools.count(1)
        self._admin: psycopg.Connection[Any] | None = None
        self._templates: dict[str, str] = {}

    # --- paths and URLs ----------------------------------------------------

    @property
    def datadir(self) -> Path:
        assert self.base is not None, "server not started"
        return self.base / "data"

    @property
    def sockdir(self) -> Path:
        assert self.base is not None, "server not started"
        return self.base / "sock"

    @property
    def logfile(self) -> Path:
        assert self.base is not None, "server not started"
        return self.base / "postgres.log"

    def url(self, dbname: str = "postgres") -> str:
        """A libpq URL for one database of this server (trust auth: no password)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    # --- running commands as the cluster's owner ----------------------------

    def _run(self, argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": f"{self.bindir}:/usr/bin:/bin",
            "LC_ALL": "C",
            "LANG": "C",
            "HOME": str(self.base),
            "TZ": "UTC",
        }
        ids: dict[str, Any] = {}
        if self.as_root:
            ids = {"user": self.uid, "group": self.gid, "extra_groups": []}
        try:
            return subprocess.run(
                list(argv),
                cwd=self.base,  # the unprivileged user may not be able to enter the current directory
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
                **ids,
            )
        except (OSError, subprocess.SubprocessError) as error:
            raise PostgresUnavailable(
                f"{Path(argv[0]).name} could not run as OS user {self.os_user!r}: {error}"
            ) from error

    def _check(self, what: str, result: subprocess.CompletedProcess[str]) -> None:
        if result.returncode != 0:
            log = ""
            with contextlib.suppress(OSError, AssertionError):
                log = self.logfile.read_text(errors="replace")[-3000:]
            raise PostgresUnavailable(
                f"{what} failed (exit {result.returncode}) as OS user {self.os_user!r} with "
                f"{self.bindir}:\n{result.stdout}\n{result.stderr}\n{log}".rstrip()
            )

    # --- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        started = time.perf_counter()
        parent = choose_parent(self.as_root)
        sweep_stale(parent)
        self.base = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
        (self.base / OWNER_FILE).write_text(f"{os.getpid()}\n")
        if self.as_root:
            os.chown(self.base, self.uid, self.gid)
        os.chmod(self.base, 0o700)
        try:
            self._initdb()
            self.timings["initdb_s"] = time.perf_counter() - started
            self._start_server()
            self.timings["start_s"] = time.perf_counter() - started
        except BaseException:
            self.stop()
            raise

    def _initdb(self) -> None:
        result = self._run(
            [
                str(self.bindir / "initdb"),
                "--pgdata",
                str(self.datadir),
                "--username",
                SUPERUSER,
                "--locale=C",
                "--encoding=UTF8",
                "--auth=trust",
                "--no-sync",
            ]
        )
        self._check("initdb", result)
        # Only loopback TCP and the private socket: trust is fine for nobody else can reach it.
        (self.datadir / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 trust\n"
        )
        if self.as_root:
            os.chown(self.datadir / "pg_hba.conf", self.uid, self.gid)
        self.sockdir.mkdir()
        if self.as_root:
            os.chown(self.sockdir, self.uid, self.gid)

    def restart(self, mode: str = "fast", down_for: float = 0.0) -> None:
        """``pg_ctl stop -m MODE`` (``fast`` ends sessions cleanly, ``immediate`` is a crash:
        recovery from the WAL at start), ``down_for`` seconds away, then start again on the
        same port, as an operator's restart or a failover back looks to its clients."""
        pg_ctl = str(self.bindir / "pg_ctl")
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()
            self._admin = None
        self._check(
            f"pg_ctl stop -m {mode}",
            self._run([pg_ctl, "stop", "--wait", "-m", mode, "-D", str(self.datadir)], timeout=60),
        )
        time.sleep(down_for)
        self._start_server(port=self.port)

    def _start_server(self, port: int | None = None) -> None:
        last: PostgresUnavailable | None = None
        for _ in range(5):  # a free port can be taken between choosing it and binding it
            self.port = port or free_port()
            options = " ".join(
                [f"-p {self.port}", f"-k {self.sockdir}"] + [f"-c {s}" for s in self.settings]
            )
            result = self._run(
                [
                    str(self.bindir / "pg_ctl"),
                    "start",
                    "--wait",
                    "--timeout=60",
                    "--pgdata",
                    str(self.datadir),
                    "--log",
                    str(self.logfile),
                    "-o",
                    options,
                ],
                timeout=90,
            )
            try:
                self._check("pg_ctl start", result)
            except PostgresUnavailable as error:
                last = error
                if "Address already in use" in str(error) or "could not bind" in str(error):
                    continue
                raise
            self._admin = self._wait_accepting()
            return
        assert last is not None
        raise last

    def _wait_accepting(self, timeout: float = 30) -> psycopg.Connection[Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return psycopg.connect(self.url(), autocommit=True, connect_timeout=5)
            except psycopg.OperationalError as error:
                if time.monotonic() > deadline:
                    raise PostgresUnavailable(
                        f"PostgreSQL on 127.0.0.1:{self.port} does not accept connections: {error}"
                    ) from error
                time.sleep(0.05)

    def postmaster_pid(self) -> int:
        return int((self.datadir / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        """Stop the server (fast shutdown: active sessions are ended) and remove its directory."""
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()
            self._admin = None
        if self.base is None:
            return
        if (self.datadir / "postmaster.pid").exists():
            pg_ctl = str(self.bindir / "pg_ctl")
            stopped = False
            with contextlib.suppress(PostgresUnavailable):
                fast = [pg_ctl, "stop", "--wait", "-m", "fast", "-D", str(self.datadir)]
                stopped = self._run(fast, timeout=60).returncode == 0
            if not stopped:
                with contextlib.suppress(PostgresUnavailable):
                    self._run([pg_ctl, "stop", "-m", "immediate", "-D", str(self.datadir)])
        shutil.rmtree(self.base, ignore_errors=True)
        self.base = None

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- databases ---------------------------------------------------------

    def admin(self) -> psycopg.Connection[Any]:
        """An autocommit connection to the `postgres` database, for harness bookkeeping."""
        if self._admin is None or self._admin.closed or self._admin.broken:
            self._admin = psycopg.connect(self.url(), autocommit=True, connect_timeout=5)
        return self._admin

    def new_database(self, template: str = "template0", strategy: str | None = None) -> str:
        """A fresh database (a copy of `template`, by default the pristine template0); its URL.

        `strategy` is PostgreSQL's CREATE DATABASE strategy: WAL_LOG (the default since 15)
        or FILE_COPY.
        """
        name = f"t{os.getpid()}_{next(self._names)}"
        query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)
        )
        if strategy is not None:
            query = sql.SQL("{} STRATEGY {}").format(query, sql.SQL(strategy.upper()))
        started = time.perf_counter()
        self.admin().execute(query)
        self.timings["last_create_database_s"] = time.perf_counter() - started
        return self.url(name)

    def template(self, key: str, build: Callable[[str], None]) -> str:
        """A template database made once per session: `build(url)` fills a fresh database (say,
        runs the migrations and closes its connections), then it becomes a template. Pass the
        answer to new_database(template=...) for a ready database in one CREATE DATABASE."""
        if key not in self._templates:
            url = self.new_database()
            build(url)
            self._templates[key] = self.make_template(url.rsplit("/", 1)[-1])
        return self._templates[key]

    def make_template(self, name: str) -> str:
        """Turn a database (say, one with the migrations applied) into a template; its name.

        Every connection to it must be closed first: PostgreSQL copies only an idle template.
        """
        self.admin().execute(
            sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false").format(
                sql.Identifier(name)
            )
        )
        return name

    def drop_database(self, url_or_name: str) -> None:
        """Drop a database, ending any session still on it (a daemon a test left running)."""
        name = url_or_name.rsplit("/", 1)[-1].split("?", 1)[0]
        self._wait_backends_gone(name)
        self.admin().execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    def _wait_backends_gone(self, name: str, timeout: float = 0.5) -> None:
        """Wait a little for the backends of connections just closed to exit.

        DROP DATABASE that finds a backend still on the database (a client closed it, the
        backend is still exiting) sleeps in steps of 100 ms; polling here every millisecond
        makes the common drop right after a test ~4 ms instead of ~105 ms. Sessions still open
        after the timeout are ended by DROP ... WITH (FORCE).
        """
        rows = (
            self.admin()
            .execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,))
            .fetchall()
        )
        pending = {int(row[0]) for row in rows}
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            pending = {pid for pid in pending if _alive(pid)}
            if pending:
                time.sleep(0.001)

    @contextlib.contextmanager
    def database(self, template: str = "template0") -> Iterator[str]:
        """A fresh database for the span of a with-block, dropped after it."""
        url = self.new_database(template)
        try:
            yield url
        finally:
            self.drop_database(url)

    # --- the reset alternative: one database reused, emptied between tests --------

    def reset_database(
        self, url: str, keep: Sequence[str] = ("schema_version", "generations")
    ) -> None:
        """Empty every table of the database at `url` but those in `keep`, in place.

        The alternative to a new database per test where CREATE DATABASE is slow (a disk-backed
        cluster): other sessions on it are ended first (their advisory locks, such as a leader's,
        go with them), then every table is emptied in one transaction with foreign-key triggers
        off, and every sequence restarts.
        """
        name = url.rsplit("/", 1)[-1].split("?", 1)[0]
        self.admin().execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        with psycopg.connect(url) as conn:
            conn.execute("SET LOCAL session_replication_role = replica")  # no FK order needed
            tables = conn.execute(
                "SELECT schemaname, tablename FROM pg_tables"
                " WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
            ).fetchall()
            for schema, table in tables:
                if table not in keep:
                    conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, table)))
            sequences = conn.execute("SELECT schemaname, sequencename FROM pg_sequences").fetchall()
            for schema, sequence in sequences:
                conn.execute(
                    sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier(schema, sequence))
                )
